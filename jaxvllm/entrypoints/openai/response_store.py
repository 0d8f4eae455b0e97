"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: in memory, at most
`--max-stored-responses` of them, the least recently used dropped first. Each keeps the
conversation that led to it (instructions excepted, as OpenAI does) as a tuple that shares
its messages with its predecessor's, so a long chain costs one reference per message."""
from __future__ import annotations

from collections import OrderedDict


class ResponseStore:
    def __init__(self, max_size: int):
        self.max_size = max_size
        self._items: OrderedDict[str, tuple[dict, tuple[dict, ...]]] = OrderedDict()

    def put(self, response_id: str, response: dict, conversation: tuple[dict, ...]) -> None:
        if self.max_size == 0:
            return
        self._items[response_id] = (response, conversation)
        self._items.move_to_end(response_id)
        while len(self._items) > self.max_size:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[dict, tuple[dict, ...]] | None:
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item

    def __len__(self) -> int:
        return len(self._items)
