"""Data parallelism: N engine cores behind one front end (vLLM's DPAsyncMPClient and
DPLBAsyncMPClient).

Each core is an engine process of its own (core_client), with its own scheduler, KV cache
and devices (platforms/device_sets.py). The clients here wrap one MP client per core:
- a new request goes to the least-loaded live core (dp_load_balancer.py); it and its
  aborts stay there until it finishes;
- each core's outputs are merged into one stream, tagged with the core's index (the
  `engine` label in /metrics);
- when a core dies its own requests end with an error naming it and the others keep
  serving; the client is dead (EngineDeadError) only when every core is. A dead core is
  not restarted here: the server reports it (/health 503) and its supervisor restarts
  the whole server, which reloads every core the same tested way a start does.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.engine.core_client import AsyncMPClient, SyncMPClient
from jaxvllm.engine.dp_load_balancer import DPLoadBalancer
from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.engine.messages import EngineCoreOutputs, EngineCoreRequest

_STOP = object()
logger = logging.getLogger(__name__)


def _start_cores(client_cls, args: EngineArgs) -> list:
    """One client (and engine process) per rank, started from this thread and loaded
    together; if one fails to start, the others are shut down and its error raised."""
    clients = []
    try:
        for rank in range(args.data_parallel_size):
            clients.append(client_cls(args, rank, wait_ready=False))
    except BaseException:
        for client in clients:
            client.shutdown()
        raise
    with ThreadPoolExecutor(len(clients)) as pool:
        errors = [f.exception() for f in [pool.submit(c.wait_ready) for c in clients]]
    failed = [e for e in errors if e is not None]
    if failed:
        for client in clients:
            client.shutdown()
        raise failed[0]
    for rank, client in enumerate(clients):
        logger.info("Data-parallel engine core %d: pid %s", rank, client.engine_core_pid)
    return clients


def _total(values: list):
    """Counts summed over the cores; per-position counts position by position, named
    counts (a KV connector's) name by name."""
    if isinstance(values[0], dict):
        return {k: sum(v.get(k, 0) for v in values) for k in dict.fromkeys(k for v in values for k in v)}
    return [sum(v) for v in zip(*values)] if isinstance(values[0], list) else sum(values)


def combine_utility_results(method: str, results: list):
    """One answer for a utility called on every live core."""
    if method == "get_stats":
        stats = [SchedulerStats(**r) if isinstance(r, dict) else r for r in results]
        total = SchedulerStats(**{f: _total([getattr(s, f) for s in stats])
                                  for f in vars(stats[0]) if f != "kv_cache_usage"})
        total.kv_cache_usage = sum(s.kv_cache_usage for s in stats) / len(stats)
        return dataclasses.asdict(total)
    if method == "reset_prefix_cache":
        return all(results)
    return results[0]


class _DPClientBase:
    def __init__(self, clients: list):
        self.clients = clients
        self.config: EngineConfig = clients[0].config
        self.balancer = DPLoadBalancer(len(clients))

    @property
    def engine_dead(self) -> bool:
        return self.balancer.all_dead

    @property
    def dead_engines(self) -> list[int]:
        """The cores that died (their requests failed; /health reports them)."""
        return [i for i, ok in enumerate(self.balancer.alive) if not ok]

    @property
    def engine_core_pid(self) -> int | None:
        return self.clients[0].engine_core_pid

    @property
    def engine_core_pids(self) -> list[int | None]:
        return [c.engine_core_pid for c in self.clients]

    def _live(self) -> list:
        return [c for i, c in enumerate(self.clients) if self.balancer.alive[i]]

    def _on_core_output(self, index: int, item) -> list:
        """What the merged stream gets for one item from core `index`."""
        if isinstance(item, EngineDeadError):
            failed = self.balancer.fail_engine(index)
            return [failed] + ([EngineDeadError()] if self.balancer.all_dead else [])
        item.engine_index = index
        self.balancer.record(index, item)
        return [item]


class DPSyncMPClient(_DPClientBase):
    """Under LLMEngine: a thread per core moves its outputs onto one queue."""

    def __init__(self, args: EngineArgs):
        super().__init__(_start_cores(SyncMPClient, args))
        self.outputs_queue: queue.Queue = queue.Queue()
        self._pumps = [threading.Thread(target=self._pump, args=(i,), daemon=True,
                                        name=f"DPOutputPump-{i}") for i in range(len(self.clients))]
        for t in self._pumps:
            t.start()

    def _pump(self, index: int) -> None:
        client = self.clients[index]
        while True:
            try:
                item = client.get_output()
            except EngineDeadError as e:
                item = e
            if item is _STOP:
                return
            for out in self._on_core_output(index, item):
                self.outputs_queue.put(out)
            if isinstance(item, EngineDeadError):
                return

    def get_output(self) -> EngineCoreOutputs:
        item = self.outputs_queue.get()
        if isinstance(item, Exception):
            self.outputs_queue.put(item)
            raise item
        return item

    def add_request(self, request: EngineCoreRequest) -> None:
        while True:
            index = self.balancer.choose(request.request_id)
            try:
                return self.clients[index].add_request(request)
            except EngineDeadError:  # died since its last output: try the others
                self.balancer.mark_dead(index, request.request_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        for index, ids in self.balancer.take(request_ids).items():
            self.clients[index].abort_requests(ids)

    def call_utility(self, method: str, *args):
        return combine_utility_results(method, [c.call_utility(method, *args) for c in self._live()])

    def shutdown(self) -> None:
        with ThreadPoolExecutor(len(self.clients)) as pool:
            list(pool.map(lambda c: c.shutdown(), self.clients))
        for client in self.clients:
            client.outputs_queue.put(_STOP)


class DPAsyncMPClient(_DPClientBase):
    """Under AsyncLLM: a task per core, in the event loop that first uses the client,
    moves its outputs onto one queue."""

    def __init__(self, args: EngineArgs):
        super().__init__(_start_cores(AsyncMPClient, args))
        self.outputs_queue: asyncio.Queue | None = None
        self._tasks: list[asyncio.Task] = []

    def _ensure_started(self) -> None:
        if self.outputs_queue is None:
            self.outputs_queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._pump(i)) for i in range(len(self.clients))]

    async def _pump(self, index: int) -> None:
        client = self.clients[index]
        while True:
            try:
                item = await client.get_output_async()
            except EngineDeadError as e:
                item = e
            for out in self._on_core_output(index, item):
                self.outputs_queue.put_nowait(out)
            if isinstance(item, EngineDeadError):
                return

    async def get_output_async(self) -> EngineCoreOutputs:
        self._ensure_started()
        item = await self.outputs_queue.get()
        if isinstance(item, Exception):
            self.outputs_queue.put_nowait(item)
            raise item
        return item

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._ensure_started()
        while True:
            index = self.balancer.choose(request.request_id)
            try:
                return await self.clients[index].add_request_async(request)
            except EngineDeadError:
                self.balancer.mark_dead(index, request.request_id)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for index, ids in self.balancer.take(request_ids).items():
            await self.clients[index].abort_requests_async(ids)

    async def call_utility_by_engine_async(self, method: str, *args) -> dict[int, object]:
        self._ensure_started()
        live = [i for i, ok in enumerate(self.balancer.alive) if ok]
        results = await asyncio.gather(*(self.clients[i].call_utility_async(method, *args)
                                         for i in live))
        return dict(zip(live, results))

    async def call_utility_async(self, method: str, *args):
        by_engine = await self.call_utility_by_engine_async(method, *args)
        return combine_utility_results(method, list(by_engine.values()))

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        with ThreadPoolExecutor(len(self.clients)) as pool:
            list(pool.map(lambda c: c.shutdown(), self.clients))
