"""JaxTransferConnector, scheduler side: disaggregated prefill and decode (vLLM's P/D through
a KV connector, as NixlConnector does it; the copies are jax.experimental.transfer's, in
jax_transfer_worker.py).

A request's `kv_transfer_params` (vLLM's names) say its part:
- `{"do_remote_decode": true}` on a prefill engine (kv_role kv_producer or kv_both): the
  step that computes its prompt's last token also gathers the prompt's pages for sending,
  and the request's last output carries where to pull them from:
  `{"do_remote_prefill": true, "remote_host", "remote_port", "remote_transfer_id",
  "remote_num_tokens"}`. Its pages go back to the pool at once: the send reads a copy.
  Those copies are device memory beside the pool, so the memory plan reserves
  `num_send_blocks` rows for them (kv_connector_extra_config; default two prompts of
  max_model_len): a request is admitted only while its copy fits beside the ones not yet
  pulled or expired, and waits otherwise.
- those params on a decode engine (kv_consumer or kv_both): the request is admitted with
  pages for its whole prompt and waits outside the batch while the worker pulls the KV;
  then it computes only its last prompt token (for its logits) and decodes. A pull that
  fails or times out leaves it to compute its prompt here (one try only).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from jaxvllm.kv_transfer.base import KVConnectorBase_V1
from jaxvllm.outputs import KVConnectorOutput

SENDS = ("kv_producer", "kv_both")
RECEIVES = ("kv_consumer", "kv_both")
CHUNK_BLOCKS = 64  # both engines cut a prompt's pages alike, so chunk shapes match


def held_rows(num_tokens: int, block_size: int, num_groups: int, chunk_blocks: int = CHUNK_BLOCKS) -> int:
    """Rows (a block of every layer) a prompt's device copy takes: its blocks in every group,
    gathered in chunks each padded to a power of two (worker/kv_block_copy.py's buckets)."""
    full, rest = divmod(num_groups * -(-num_tokens // block_size), chunk_blocks)
    return full * chunk_blocks + (min(1 << (rest - 1).bit_length(), chunk_blocks) if rest else 0)


def num_send_blocks(config) -> int:
    """The rows the prefill engine's copies awaiting a pull may take at once (default: two
    prompts of max_model_len in one group's blocks)."""
    extra = config.kv_transfer.kv_connector_extra_config
    return extra.get("num_send_blocks") or 2 * held_rows(config.scheduler.max_model_len, config.cache.block_size, 1)


@dataclass
class RemoteLoad:
    """Pull transfer_id from the prefill engine at host:port into block_ids (every group's
    table, prompt blocks only; entries before start_block are the local prefix hit's)."""
    req_id: str
    host: str
    port: int
    transfer_id: int
    start_block: int
    block_ids: list[list[int]]


@dataclass
class JaxTransferConnectorMetadata:
    sends: list[tuple[str, int, list[list[int]]]] = field(default_factory=list)  # (request, transfer id, tables)
    loads: list[RemoteLoad] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)  # aborted while loading: their pages are gone
    idle: bool = False  # nothing to compute this step: the worker may wait a moment for a pull


def check_kv_transfer_params(config, params, num_prompt_tokens: int = 0, num_groups: int = 1) -> None:
    """A request's kv_transfer_params against this engine (ValueError naming the field)."""
    if params is None:
        return
    kv = config.kv_transfer
    if kv is None or kv.kv_connector != "JaxTransferConnector":
        raise ValueError("kv_transfer_params needs an engine started with kv_transfer_config "
                         "{\"kv_connector\": \"JaxTransferConnector\"}.")
    if params.get("do_remote_decode"):
        if kv.kv_role not in SENDS:
            raise ValueError(f"kv_transfer_params.do_remote_decode needs kv_role in {list(SENDS)}, "
                             f"this engine's is {kv.kv_role!r}.")
        need, cap = held_rows(num_prompt_tokens, config.cache.block_size, num_groups), num_send_blocks(config)
        if need > cap:
            raise ValueError(f"kv_transfer_params.do_remote_decode: the prompt's copy takes {need} blocks, more than "
                             f"the prefill engine holds for sends (kv_connector_extra_config.num_send_blocks={cap}).")
    if params.get("do_remote_prefill"):
        if kv.kv_role not in RECEIVES:
            raise ValueError(f"kv_transfer_params.do_remote_prefill needs kv_role in {list(RECEIVES)}, "
                             f"this engine's is {kv.kv_role!r}.")
        for name, kind in (("remote_host", str), ("remote_port", int), ("remote_transfer_id", int),
                           ("remote_num_tokens", int)):
            if type(params.get(name)) is not kind:
                raise ValueError(f"kv_transfer_params.{name} must be a{'n' if kind is int else ''} "
                                 f"{kind.__name__} (the prefill engine's reply), got {params.get(name)!r}.")


class JaxTransferConnectorScheduler(KVConnectorBase_V1):
    def __init__(self, config, role, kv_cache_config, kv_cache_manager, use_eagle: bool = False):
        super().__init__(config, role, kv_cache_config)
        self.host, self.port = config.kv_transfer.kv_ip, config.kv_transfer.kv_port
        self.block_size = kv_cache_config.block_size
        self.kv_cache_manager = kv_cache_manager
        self._to_send: dict[str, object] = {}  # prefill requests whose prompt is not computed yet
        self._sent: dict[str, tuple[int, int]] = {}  # request -> (transfer id, prompt tokens)
        self._to_load: dict[str, dict] = {}  # matched this step, pages not allocated yet
        self._loading: set[str] = set()
        self._groups = len(kv_cache_config.kv_cache_groups)
        self._chunk = min(kv_cache_config.num_blocks - 1, CHUNK_BLOCKS)
        self._send_cap = num_send_blocks(config)
        self._held: dict[str, int] = {}  # request -> rows its copy takes, from admission until pulled or expired
        self._meta = JaxTransferConnectorMetadata()
        self.worker_stats: dict[str, float] = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """(None, False) for a prefill request whose copy does not fit beside the held ones:
        it waits at the head of the queue."""
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode"):
            if request.request_id not in self._held:
                rows = held_rows(request.num_prompt_tokens, self.block_size, self._groups, self._chunk)
                if sum(self._held.values()) + rows > self._send_cap:
                    return None, False
                self._held[request.request_id] = rows
            self._to_send[request.request_id] = request
        elif params.get("do_remote_prefill"):
            params["do_remote_prefill"] = False  # one try: after a failure it computes here
            # The prefill engine sent its prompt's pages; another prompt could not use them.
            if params["remote_num_tokens"] == request.num_prompt_tokens > num_computed_tokens:
                self._to_load[request.request_id] = params
                return request.num_prompt_tokens - num_computed_tokens, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        params = self._to_load.pop(request.request_id, None)
        if params is None or not num_external_tokens:
            return
        num_blocks = -(-request.num_prompt_tokens // self.block_size)
        start = (request.num_prompt_tokens - num_external_tokens) // self.block_size
        self._meta.loads.append(RemoteLoad(
            request.request_id, params["remote_host"], params["remote_port"], params["remote_transfer_id"],
            start, [[b.block_id for b in group[:num_blocks]] for group in blocks.blocks]))
        self._loading.add(request.request_id)

    def build_connector_meta(self, scheduler_output) -> JaxTransferConnectorMetadata:
        """Sends for the prefill requests whose prompt this step completes (the worker
        gathers their pages after the step's forward)."""
        meta, self._meta = self._meta, JaxTransferConnectorMetadata()
        for req_id, request in list(self._to_send.items()):
            if request.num_computed_tokens >= request.num_prompt_tokens:
                del self._to_send[req_id]
                transfer_id = secrets.randbits(63)
                num_blocks = -(-request.num_prompt_tokens // self.block_size)
                tables = [ids[:num_blocks] for ids in self.kv_cache_manager.get_block_ids(req_id)]
                meta.sends.append((req_id, transfer_id, tables))
                self._sent[req_id] = (transfer_id, request.num_prompt_tokens)
        meta.idle = scheduler_output.total_num_scheduled_tokens == 0
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._loading -= connector_output.finished_recving
        for req_id in connector_output.finished_sending:  # its copy was pulled, or expired
            self._held.pop(req_id, None)
        self.worker_stats = connector_output.kv_connector_stats

    def request_finished(self, request, block_ids) -> tuple[bool, dict | None]:
        """The pages go back at once (a send reads its own copy of them); a prefill
        request's params say where the decode engine pulls its KV from."""
        req_id = request.request_id
        self._to_send.pop(req_id, None)
        self._to_load.pop(req_id, None)
        if req_id in self._loading:
            self._loading.discard(req_id)
            self._meta.cancels.append(req_id)
        sent = self._sent.pop(req_id, None)
        if sent is None:
            self._held.pop(req_id, None)  # finished before its copy was made
            return False, None
        return False, {"do_remote_prefill": True, "do_remote_decode": False, "remote_host": self.host,
                       "remote_port": self.port, "remote_transfer_id": sent[0], "remote_num_tokens": sent[1]}

    def make_stats(self) -> dict[str, float]:
        return dict(self.worker_stats)
