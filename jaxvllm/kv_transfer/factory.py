"""KVConnectorFactory: `kv_transfer_config.kv_connector` names a connector; each role gets
its side of it (vLLM's KVConnectorFactory.create_connector)."""
from __future__ import annotations

import importlib

from jaxvllm.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole

# name -> (module, scheduler-side class, worker-side class)
_CONNECTORS = {
    "OffloadingConnector": ("jaxvllm.kv_transfer.offloading_connector", "OffloadingConnectorScheduler",
                            "jaxvllm.worker.kv_connector.offloading_worker", "OffloadingConnectorWorker"),
    "JaxTransferConnector": ("jaxvllm.kv_transfer.jax_transfer_connector", "JaxTransferConnectorScheduler",
                             "jaxvllm.worker.kv_connector.jax_transfer_worker", "JaxTransferConnectorWorker"),
}
CONNECTOR_NAMES = tuple(_CONNECTORS)


class KVConnectorFactory:
    @staticmethod
    def get_connector_class(config, role: KVConnectorRole) -> type[KVConnectorBase_V1]:
        name = config.kv_transfer.kv_connector
        if name not in _CONNECTORS:
            raise ValueError(f"kv_transfer_config.kv_connector must be one of {list(CONNECTOR_NAMES)}, got {name!r}.")
        sched_module, sched_cls, worker_module, worker_cls = _CONNECTORS[name]
        module, cls = (sched_module, sched_cls) if role == KVConnectorRole.SCHEDULER else (worker_module, worker_cls)
        return getattr(importlib.import_module(module), cls)

    @staticmethod
    def create_connector(config, role: KVConnectorRole, kv_cache_config, **scheduler_state) -> KVConnectorBase_V1:
        """scheduler_state: what the scheduler side reads of the scheduler (its
        kv_cache_manager, use_eagle)."""
        cls = KVConnectorFactory.get_connector_class(config, role)
        if role == KVConnectorRole.SCHEDULER:
            return cls(config, role, kv_cache_config, **scheduler_state)
        return cls(config, role, kv_cache_config)
