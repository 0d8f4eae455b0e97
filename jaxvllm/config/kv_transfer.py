"""`kv_transfer_config` as vLLM takes it (a dict, or its JSON: --kv-transfer-config) resolved
into the KVTransferConfig section, and its checks, each naming the field and its limit."""
from __future__ import annotations

from dataclasses import dataclass, field

from jaxvllm.config.json_section import section_fields
from jaxvllm.kv_transfer.factory import CONNECTOR_NAMES

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
_OFFLOADING_EXTRA = ("num_cpu_blocks", "cpu_bytes_to_use", "num_staging_blocks", "block_size")


@dataclass(frozen=True)
class KVTransferConfig:
    """A KV connector (vLLM's `kv_transfer_config`, jaxvllm/kv_transfer): `kv_connector`
    names it, `kv_role` is kv_producer, kv_consumer or kv_both, `kv_connector_extra_config`
    holds its own settings (OffloadingConnector: num_cpu_blocks or cpu_bytes_to_use,
    num_staging_blocks; JaxTransferConnector: pull_timeout_s, send_timeout_s,
    num_send_blocks). kv_ip and kv_port: where a prefill engine's side channel listens
    (vLLM's defaults)."""
    kv_connector: str | None = None
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579


def parse_kv_transfer_config(value) -> KVTransferConfig | None:
    value = section_fields(value, KVTransferConfig, "kv_transfer_config")
    if value is None or isinstance(value, KVTransferConfig):
        return value
    return KVTransferConfig(**value)


def verify_kv_transfer(config) -> None:
    kv = config.kv_transfer
    if kv is None:
        return
    if kv.kv_connector not in CONNECTOR_NAMES:
        raise ValueError(f"kv_transfer_config.kv_connector must be one of {list(CONNECTOR_NAMES)}, "
                         f"got {kv.kv_connector!r}.")
    if kv.kv_role not in KV_ROLES:
        raise ValueError(f"kv_transfer_config.kv_role must be one of {list(KV_ROLES)}, got {kv.kv_role!r}.")
    if not isinstance(kv.kv_connector_extra_config, dict):
        raise ValueError("kv_transfer_config.kv_connector_extra_config must be a dict, got "
                         f"{type(kv.kv_connector_extra_config).__name__}.")
    p = config.parallel
    # The connector's worker side copies one process's KV cache: one worker (a Ray actor, on
    # any node, for P/D), one stage.
    one_ray_worker = (kv.kv_connector == "JaxTransferConnector" and p.distributed_executor_backend == "ray"
                      and p.ray_workers == 1 and p.nnodes == 1)
    if (p.is_multiprocess and not one_ray_worker) or p.pipeline_parallel_size > 1:
        raise ValueError("kv_transfer_config needs distributed_executor_backend='uni' (JaxTransferConnector: "
                         "or 'ray' with ray_workers=1), nnodes=1 and pipeline_parallel_size=1 (the "
                         "connector's worker side copies one process's KV cache).")
    if kv.kv_connector == "OffloadingConnector":
        _verify_offloading(config, kv)
    elif kv.kv_connector == "JaxTransferConnector":
        _verify_jax_transfer(kv)


def _verify_jax_transfer(kv: KVTransferConfig) -> None:
    extra, name = kv.kv_connector_extra_config, "kv_transfer_config.kv_connector_extra_config"
    if unknown := sorted(set(extra) - {"pull_timeout_s", "send_timeout_s", "num_send_blocks"}):
        raise ValueError(f"{name} has unknown fields {unknown} for JaxTransferConnector; known: "
                         "['pull_timeout_s', 'send_timeout_s', 'num_send_blocks'].")
    for key in ("pull_timeout_s", "send_timeout_s"):
        if key in extra and not (type(extra[key]) in (int, float) and extra[key] > 0):
            raise ValueError(f"{name}.{key} must be a positive number of seconds, got {extra[key]!r}.")
    if "num_send_blocks" in extra and (type(extra["num_send_blocks"]) is not int or extra["num_send_blocks"] < 1):
        raise ValueError(f"{name}.num_send_blocks must be a positive integer, got {extra['num_send_blocks']!r}.")
    if not isinstance(kv.kv_ip, str) or not kv.kv_ip:
        raise ValueError(f"kv_transfer_config.kv_ip must be a host address, got {kv.kv_ip!r}.")
    if type(kv.kv_port) is not int or not 1 <= kv.kv_port <= 65535:
        raise ValueError(f"kv_transfer_config.kv_port must be a port in [1, 65535], got {kv.kv_port!r}.")


def _verify_offloading(config, kv: KVTransferConfig) -> None:
    extra, name = kv.kv_connector_extra_config, "kv_transfer_config.kv_connector_extra_config"
    if kv.kv_role != "kv_both":
        raise ValueError(f"OffloadingConnector stores and loads its own KV: kv_transfer_config.kv_role "
                         f"must be 'kv_both', got {kv.kv_role!r}.")
    if unknown := sorted(set(extra) - set(_OFFLOADING_EXTRA)):
        raise ValueError(f"{name} has unknown fields {unknown} for OffloadingConnector; known: "
                         f"{list(_OFFLOADING_EXTRA)}.")
    if ("num_cpu_blocks" in extra) == ("cpu_bytes_to_use" in extra):
        raise ValueError(f"{name} needs exactly one of num_cpu_blocks and cpu_bytes_to_use (the host "
                         f"tier's size), got {sorted(extra)}.")
    for key in ("num_cpu_blocks", "cpu_bytes_to_use", "num_staging_blocks"):
        if key in extra and (type(extra[key]) is not int or extra[key] < 1):
            raise ValueError(f"{name}.{key} must be a positive integer, got {extra[key]!r}.")
    if extra.get("block_size", config.cache.block_size) != config.cache.block_size:
        raise ValueError(f"{name}.block_size must equal the KV cache's block_size ({config.cache.block_size}): "
                         f"the host tier keeps whole pages, got {extra['block_size']!r}.")
    if not config.cache.enable_prefix_caching:
        raise ValueError("OffloadingConnector keeps the prefix cache's evicted blocks: it needs "
                         "enable_prefix_caching=True.")
