"""The waiting queue under the two scheduling policies (vLLM's names).

"fcfs": arrival order; a preempted request goes back to the front, so it resumes first.
"priority": lowest `priority` value first, then earliest arrival; a preempted request
simply goes back in, and its key puts it where it belongs.
"""
from __future__ import annotations

import heapq
from collections import deque

from jaxvllm.core.request import Request


class FCFSRequestQueue(deque):
    def add_request(self, request: Request) -> None:
        self.append(request)

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def peek_request(self) -> Request:
        return self[0]

    def pop_request(self) -> Request:
        return self.popleft()

    def remove_request(self, request: Request) -> None:
        self.remove(request)


class PriorityRequestQueue:
    def __init__(self):
        self._heap: list[tuple[int, float, int, Request]] = []
        self._count = 0  # tie-breaker: requests themselves are not comparable

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, self._count, request))
        self._count += 1

    prepend_request = add_request

    def peek_request(self) -> Request:
        return self._heap[0][3]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_request(self, request: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))


def create_request_queue(policy: str):
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {policy!r}.")
