"""The KV connector interface (vLLM's KVConnectorBase_V1), split as vLLM splits it: one
instance beside the scheduler (role SCHEDULER) decides what moves, one in the worker (role
WORKER) moves it.

One step, in order:
- scheduler: for a waiting request, `get_num_new_matched_tokens` says how many tokens past
  the local prefix hit the connector can supply; after the pages are allocated,
  `update_state_after_alloc` records where they go; at the end of `schedule`,
  `build_connector_meta` packs the step's work into the SchedulerOutput.
- worker: `bind_connector_metadata`, then `start_load_kv` before the forward (it takes and
  returns the KV cache: a JAX array is a value, donated from program to program), then
  `wait_for_save` once the forward is dispatched (it reads the cache that forward
  returns), and `get_finished` for the requests whose transfers ended; what the worker
  reports comes back in ModelRunnerOutput as a KVConnectorOutput, to `update_connector_output`
  (loads that failed as `get_block_ids_with_load_errors`: their pages are computed again).
- scheduler, when a request finishes: `request_finished` says whether its pages must
  outlive it (a transfer still reads them).

vLLM's per-layer hooks (`wait_for_layer_load`, `save_kv_layer`) have no place here: the
forward is one compiled program over every layer, so a connector moves a step's KV before
it starts (`start_load_kv`) and after it is dispatched (`wait_for_save`), and device order
keeps the copies and the forward apart.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from jaxvllm.outputs import KVConnectorOutput
from jaxvllm.serial_utils import convert

if TYPE_CHECKING:  # the scheduler's side loads no JAX
    import jax


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorBase_V1:
    """A connector's defaults: nothing to match, to load or to save."""
    metadata_cls: type | None = None  # what build_connector_meta returns (the worker side's orders)

    def __init__(self, config, role: KVConnectorRole, kv_cache_config):
        self.config = config
        self.role = role
        self.kv_cache_config = kv_cache_config
        self._metadata = None

    # ---- scheduler side --------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens past `num_computed_tokens` (the local prefix hit) this connector can load,
        and whether the load is asynchronous (the request then waits outside the batch);
        None: not known yet, ask again next step."""
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """The request's pages (every group's table, KVCacheBlocks) after allocation; the
        `num_external_tokens` this connector matched go to the ones past the local hit."""

    def build_connector_meta(self, scheduler_output) -> Any:
        """The worker's orders for this step (the connector's own dataclass), set as
        SchedulerOutput.kv_connector_metadata."""
        return None

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """What the worker side reported after a step."""

    def request_finished(self, request, block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        """Whether the request's pages must wait for a transfer before they are freed, and
        the kv_transfer_params to return with it."""
        return False, None

    def reset_cache(self) -> None:
        """Forget what the connector holds (new weights make stored KV stale)."""

    def make_stats(self) -> dict[str, float]:
        """Counters for /metrics (cumulative, by name)."""
        return {}

    # ---- worker side -----------------------------------------------------------------
    @classmethod
    def reserved_device_bytes(cls, config, block_bytes: int) -> int:
        """Device memory the worker side holds beside the pool (the memory plan leaves it)."""
        return 0

    def register_kv_caches(self, kv_cache: jax.Array, on_compile) -> None:
        """The device pool's layout (its shape, dtype and sharding); on_compile counts a
        compilation of the connector's own programs."""

    def warmup(self, kv_cache: jax.Array) -> jax.Array:
        """Compile the connector's programs before the first step; returns the cache."""
        return kv_cache

    def bind_connector_metadata(self, metadata) -> None:
        """As built, or as a msgpack map (a worker in another process, a Ray actor, receives
        the SchedulerOutput so): then converted back to the connector's `metadata_cls`."""
        self._metadata = convert(self.metadata_cls, metadata) if isinstance(metadata, dict) else metadata

    def clear_connector_metadata(self) -> None:
        self._metadata = None

    def start_load_kv(self, kv_cache: jax.Array) -> jax.Array:
        """Before the step's forward: start this step's copies into the cache."""
        return kv_cache

    def wait_for_save(self, kv_cache: jax.Array) -> None:
        """After the forward is dispatched (kv_cache: the one it returns, read in device
        order after it): the step's saves proceed (or are done)."""

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Requests whose sends and receives ended since the last call."""
        return set(), set()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Pages of the receives just reported finished that hold no loaded KV."""
        return set()

    def get_kv_connector_stats(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        """Stop the connector's threads and free its ports (the engine is going away)."""
