"""The Responses API's stream: output items as OpenAI's typed events (added, deltas, done),
numbered by sequence_number."""
from __future__ import annotations

import json
import uuid

from jaxvllm.entrypoints.openai.protocol_responses import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def event(kind: str, seq: int, **fields) -> str:
    data = json.dumps({"type": kind, "sequence_number": seq, **fields}, ensure_ascii=False)
    return f"event: {kind}\ndata: {data}\n\n"


class ItemWriter:
    """Output items as stream events: a reasoning or message item stays open while its text
    grows and is closed when another kind starts; calls stay open until the end (a call's
    last fragment may come after the next call's first)."""

    def __init__(self, seq):
        self.seq = seq
        self.items: list = []
        self.open_text: ReasoningItem | OutputMessage | None = None
        self.calls: dict[int, FunctionCallItem] = {}
        self.reasoning: str | None = None
        self.content: str | None = None

    def _ev(self, kind, **fields) -> str:
        return event(kind, next(self.seq), **fields)

    def _add(self, item) -> str:
        self.items.append(item)
        return self._ev("response.output_item.added", output_index=len(self.items) - 1,
                        item=item.model_copy(update={"status": "in_progress"}).dump())

    def _text_part(self, item) -> dict:
        if isinstance(item, ReasoningItem):
            return ReasoningText(text=self.reasoning or "").dump()
        return OutputText(text=self.content or "").dump()

    def _close_text(self):
        item, self.open_text = self.open_text, None
        if item is None:
            return
        index = self.items.index(item)
        if isinstance(item, ReasoningItem):
            item.content = [ReasoningText(text=self.reasoning)]
            yield self._ev("response.reasoning_text.done", item_id=item.id, output_index=index,
                           content_index=0, text=self.reasoning)
        else:
            item.content = [OutputText(text=self.content)]
            yield self._ev("response.output_text.done", item_id=item.id, output_index=index,
                           content_index=0, text=self.content, logprobs=[])
        yield self._ev("response.content_part.done", item_id=item.id, output_index=index,
                       content_index=0, part=self._text_part(item))
        yield self._ev("response.output_item.done", output_index=index, item=item.dump())

    def _text(self, kind, delta: str):
        if not isinstance(self.open_text, kind):
            yield from self._close_text()
            item = kind(id=new_id("rs" if kind is ReasoningItem else "msg"))
            self.open_text = item
            yield self._add(item)
            yield self._ev("response.content_part.added", item_id=item.id,
                           output_index=len(self.items) - 1, content_index=0,
                           part=(ReasoningText(text="") if kind is ReasoningItem
                                 else OutputText(text="")).dump())
        item = self.open_text
        index = self.items.index(item)
        if kind is ReasoningItem:
            self.reasoning = (self.reasoning or "") + delta
            yield self._ev("response.reasoning_text.delta", item_id=item.id, output_index=index,
                           content_index=0, delta=delta)
        else:
            self.content = (self.content or "") + delta
            yield self._ev("response.output_text.delta", item_id=item.id, output_index=index,
                           content_index=0, delta=delta, logprobs=[])

    def feed(self, delta):
        if delta.reasoning:
            yield from self._text(ReasoningItem, delta.reasoning)
        if delta.content:
            yield from self._text(OutputMessage, delta.content)
        for tc in delta.tool_calls:
            if "id" in tc:
                yield from self._close_text()
                call = FunctionCallItem(id=new_id("fc"), call_id=tc["id"], name=tc["function"]["name"],
                                        arguments="")
                self.calls[tc["index"]] = call
                yield self._add(call)
            call = self.calls[tc["index"]]
            fragment = tc["function"]["arguments"]
            if fragment:
                call.arguments += fragment
                yield self._ev("response.function_call_arguments.delta", item_id=call.id,
                               output_index=self.items.index(call), delta=fragment)

    def close(self):
        yield from self._close_text()
        for call in self.calls.values():
            index = self.items.index(call)
            yield self._ev("response.function_call_arguments.done", item_id=call.id,
                           output_index=index, name=call.name, arguments=call.arguments)
            yield self._ev("response.output_item.done", output_index=index, item=call.dump())
