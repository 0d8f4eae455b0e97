"""The in-flight batch rules (pipeline parallelism's batch queue, engine/batch_queue.py):
with max_concurrent_batches > 1 that many batches are in flight at once.

- A request in a batch whose tokens are not back yet is not scheduled again until they are
  (vLLM V1's `scheduled_req_ids`), nor resumed if it was preempted meanwhile. Victims are
  chosen as without the queue: sparing requests in flight lets two requests that each need
  the last pages take them from each other forever.
- A batch holds at most max_num_seqs / max_concurrent_batches requests, so that the running
  requests spread over the batches instead of all riding in one.

With one batch (no pipeline) none of this applies: async scheduling schedules a request
again while its token is in flight, as a placeholder (core/scheduler.py).
"""
from __future__ import annotations


class InFlightBatches:
    def __init__(self, max_num_seqs: int, max_concurrent_batches: int):
        self.req_ids: set[str] = set()
        self.max_batch_reqs = -(-max_num_seqs // max_concurrent_batches)

    def dispatched(self, request_ids) -> None:
        self.req_ids.update(request_ids)

    def returned(self, request_ids) -> None:
        self.req_ids.difference_update(request_ids)
