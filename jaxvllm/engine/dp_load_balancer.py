"""Which data-parallel engine core takes a request, and which core each request is on.

A core's load is its running + waiting requests as it last reported them (the scheduler
stats that come with its outputs), plus the requests sent to it since that report, so
that a batch sent at once spreads over the cores before any of them has reported (vLLM's
DPLBAsyncMPClient counts the same way). Ties go to the lowest index. Thread-safe: the
sync client's output threads and its caller both use it.
"""
from __future__ import annotations

import threading

from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.engine.messages import EngineCoreOutputs
from jaxvllm.outputs import EngineCoreOutput, FinishReason


class DPLoadBalancer:
    def __init__(self, num_engines: int):
        self.alive = [True] * num_engines
        self.reported_load = [0] * num_engines
        self.sent_since_report = [0] * num_engines
        self.num_routed = [0] * num_engines  # requests sent to each core since start
        self.owner: dict[str, int] = {}  # unfinished request id -> its core
        self._lock = threading.Lock()

    @property
    def all_dead(self) -> bool:
        return not any(self.alive)

    def choose(self, request_id: str) -> int:
        with self._lock:
            live = [i for i, ok in enumerate(self.alive) if ok]
            if not live:
                raise EngineDeadError("Every data-parallel engine core has died; see their logs "
                                      "above for the cause. Restart the engine to continue.")
            index = min(live, key=lambda i: (self.reported_load[i] + self.sent_since_report[i], i))
            self.sent_since_report[index] += 1
            self.num_routed[index] += 1
            self.owner[request_id] = index
            return index

    def record(self, index: int, outputs: EngineCoreOutputs) -> None:
        """A core's outputs: its reported load, and which of its requests finished."""
        with self._lock:
            stats = outputs.scheduler_stats
            if stats is not None:
                self.reported_load[index] = stats.num_running_reqs + stats.num_waiting_reqs
                self.sent_since_report[index] = 0
            for out in outputs.outputs:
                if out.finished:
                    self.owner.pop(out.request_id, None)

    def take(self, request_ids: list[str]) -> dict[int, list[str]]:
        """The requests to abort, grouped by their live core, and forgotten. Each leaves its
        core's load at once: an idle core reports nothing until it has outputs again."""
        groups: dict[int, list[str]] = {}
        with self._lock:
            for request_id in request_ids:
                index = self.owner.pop(request_id, None)
                if index is not None and self.alive[index]:
                    groups.setdefault(index, []).append(request_id)
                    self.reported_load[index] = max(0, self.reported_load[index] - 1)
        return groups

    def mark_dead(self, index: int, request_id: str | None = None) -> None:
        """A send to core `index` found it dead; `request_id` was not delivered."""
        with self._lock:
            self.alive[index] = False
            if request_id is not None:
                self.owner.pop(request_id, None)

    def fail_engine(self, index: int) -> EngineCoreOutputs:
        """Core `index` died: an error output for each of its unfinished requests."""
        with self._lock:
            self.alive[index] = False
            lost = [r for r, i in self.owner.items() if i == index]
            for request_id in lost:
                del self.owner[request_id]
        error = (f"Data-parallel engine core {index} died while serving this request; the "
                 f"other cores keep serving (see its log above for the cause).")
        return EngineCoreOutputs(outputs=[EngineCoreOutput(r, [], FinishReason.ERROR, error=error)
                                          for r in lost], engine_index=index)
