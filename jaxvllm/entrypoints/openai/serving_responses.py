"""POST /v1/responses (OpenAI's Responses API) and GET /v1/responses/{id}.

The conversation is the stored one of `previous_response_id` plus this request's input,
with `instructions` (never carried over) in front; it renders through the chat template
and the chat path's tool plan and message parser (responses_input.py), and the reply's
reasoning, text and calls become `reasoning`, `message` and `function_call` items. A
stream sends OpenAI's typed events, each item opened, filled by deltas and closed in turn.
Replies are stored for `previous_response_id` unless the request says `store: false`.
"""
from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from jaxvllm.entrypoints.openai.errors import APIError, param_of_value_error
from jaxvllm.entrypoints.openai.message_parser import MessageParser, ParsedMessage
from jaxvllm.entrypoints.openai.protocol import ChatMessage
from jaxvllm.entrypoints.openai.protocol_responses import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
)
from jaxvllm.entrypoints.openai.response_store import ResponseStore
from jaxvllm.entrypoints.openai.responses_input import as_chat_request, input_messages, responses_param
from jaxvllm.entrypoints.openai.responses_stream import ItemWriter, event, new_id
from jaxvllm.entrypoints.openai.serving_chat import OpenAIServingChat
from jaxvllm.entrypoints.openai.serving_engine import engine_error
from jaxvllm.entrypoints.openai.strict_schema import strict_schema
from jaxvllm.entrypoints.openai.tool_choice import check_tools, plan_tools
from jaxvllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams


class OpenAIServingResponses(OpenAIServingChat):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.store = ResponseStore(self.server_args.max_stored_responses)

    def retrieve(self, response_id: str) -> dict:
        stored = self.store.get(response_id)
        if stored is None:
            raise APIError(f"No response with id {response_id!r} is stored here.", 404, "response_id")
        return stored[0]

    async def create_response(self, request: ResponsesRequest, request_id: str):
        lora = self.check_model(request.model)
        self.check_engine()
        history: tuple[dict, ...] = ()
        if request.previous_response_id is not None:
            stored = self.store.get(request.previous_response_id)
            if stored is None:
                raise APIError(f"Previous response with id {request.previous_response_id!r} not "
                               f"found (not stored, or no longer: the store keeps the last "
                               f"{self.store.max_size}).", 400, "previous_response_id")
            history = stored[1]
        own = tuple(input_messages(request.input))
        system = ({"role": "system", "content": request.instructions},) if request.instructions else ()
        messages = [ChatMessage.model_validate(m) for m in (*system, *history, *own)]
        chat_like = as_chat_request(request)
        try:
            if chat_like.tools:
                await asyncio.to_thread(check_tools, chat_like.tools)
            plan = plan_tools(chat_like, self.server_args, self.tokenizer)
        except APIError as e:
            raise responses_param(e) from e
        ids = await self.chat_renderer.render(messages, True, False, request.chat_template_kwargs,
                                              None, plan.tools)
        self.validate_prompt(ids, "input")
        params = self._sampling_params(request, plan, len(ids))
        make_parser = self.message_parser_factory(plan, ids) or MessageParser
        head = self._head(request, request_id)
        remember = lambda response, output: self._remember(request, response, history + own, output)
        gen = self.generate_all([{"prompt_token_ids": ids}], [params], request_id, lora_request=lora)
        if request.stream:
            return StreamingResponse(self._stream(head, len(ids), gen, make_parser(), remember),
                                     media_type="text/event-stream")
        try:
            final = None
            async for _, out in gen:
                final = out.outputs[0]
        except Exception as e:
            raise engine_error(e) from e
        parsed = make_parser().full(final.text)
        output = self._items(parsed)
        response = self._response(head, output, final.finish_reason, len(ids), len(final.token_ids))
        remember(response, parsed)
        return JSONResponse(response)

    def _head(self, request, request_id: str) -> dict:
        """The response's fields that echo the request."""
        choice = request.tool_choice
        fmt = request.text.format if request.text else None
        return dict(
            id=request_id, created_at=self.created(), model=self.model_name,
            instructions=request.instructions, previous_response_id=request.previous_response_id,
            tools=[t.model_dump(by_alias=True, exclude_none=True) for t in request.tools or []],
            tool_choice=choice.model_dump() if hasattr(choice, "model_dump") else choice or "auto",
            parallel_tool_calls=request.parallel_tool_calls is not False,
            temperature=request.temperature, top_p=request.top_p,
            max_output_tokens=request.max_output_tokens, metadata=request.metadata,
            store=request.store,
            text={"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}})

    def _sampling_params(self, request, plan, prompt_len: int) -> SamplingParams:
        kwargs = {"max_tokens": self.max_tokens(request.max_output_tokens, prompt_len,
                                                "max_output_tokens"),
                  "output_kind": (RequestOutputKind.DELTA if request.stream
                                  else RequestOutputKind.FINAL_ONLY)}
        kwargs |= {k: getattr(request, k) for k in ("temperature", "top_p", "seed")
                   if getattr(request, k) is not None}
        fmt = request.text.format if request.text else None
        if plan.structured_outputs is not None:
            kwargs["structured_outputs"] = plan.structured_outputs
        elif fmt is not None and fmt.type == "json_object":
            kwargs["structured_outputs"] = StructuredOutputsParams(json_object=True)
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise APIError("text.format.schema is required for type json_schema.", 400,
                               "text.format.schema")
            try:
                schema = strict_schema(fmt.schema_, "text.format.schema") if fmt.strict else fmt.schema_
            except ValueError as e:
                raise APIError(str(e), 400, "text.format.schema") from e
            kwargs["structured_outputs"] = StructuredOutputsParams(json=schema)
        if plan.parser is not None and plan.parser.keeps_special_tokens:
            kwargs["skip_special_tokens"] = False
        try:
            return SamplingParams(**kwargs)
        except ValueError as e:
            raise APIError(str(e), 400, param_of_value_error(
                str(e), {"max_tokens": "max_output_tokens"})) from e

    @staticmethod
    def _items(parsed: ParsedMessage) -> list:
        items = []
        if parsed.reasoning is not None:
            items.append(ReasoningItem(id=new_id("rs"), content=[ReasoningText(text=parsed.reasoning)]))
        if parsed.content:
            items.append(OutputMessage(id=new_id("msg"), content=[OutputText(text=parsed.content)]))
        items += [FunctionCallItem(id=new_id("fc"), call_id=c["id"], name=c["function"]["name"],
                                   arguments=c["function"]["arguments"]) for c in parsed.tool_calls]
        return items

    @staticmethod
    def _response(head: dict, output: list, finish_reason: str | None, num_prompt: int,
                  num_gen: int, status: str | None = None) -> dict:
        status = status or ("incomplete" if finish_reason == "length" else "completed")
        return ResponsesResponse(
            **head, status=status, output=output,
            incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
            usage=ResponseUsage(input_tokens=num_prompt, output_tokens=num_gen,
                                total_tokens=num_prompt + num_gen) if status != "in_progress" else None
        ).dump()

    def _remember(self, request, response: dict, conversation: tuple, parsed: ParsedMessage) -> None:
        if not request.store:
            return
        reply = {"role": "assistant", "content": parsed.content or ""}
        if parsed.tool_calls:
            reply["tool_calls"] = parsed.tool_calls
        self.store.put(response["id"], response, conversation + (reply,))

    async def _stream(self, head, num_prompt, gen, parser: MessageParser, remember):
        seq = iter(range(1 << 62))
        writer = ItemWriter(seq)
        started = self._response(head, [], None, 0, 0, "in_progress")
        yield event("response.created", next(seq), response=started)
        yield event("response.in_progress", next(seq), response=started)
        generated, finish_reason = 0, None
        try:
            async for _, out in gen:
                o = out.outputs[0]
                generated += len(o.token_ids)
                finish_reason = o.finish_reason
                for text in writer.feed(parser.feed(o.text, final=o.finish_reason is not None)):
                    yield text
        except Exception as e:
            err = engine_error(e)
            yield event("error", next(seq), code=str(err.status), message=err.message, param=err.param)
            return
        for text in writer.close():
            yield text
        parsed = ParsedMessage(writer.reasoning, writer.content,
                               [{"id": c.call_id, "type": "function",
                                 "function": {"name": c.name, "arguments": c.arguments}}
                                for c in writer.items if isinstance(c, FunctionCallItem)])
        response = self._response(head, writer.items, finish_reason, num_prompt, generated)
        remember(response, parsed)
        yield event("response.completed" if response["status"] == "completed" else "response.incomplete",
                    next(seq), response=response)


def add_responses_routes(app, engine, model_name, server_args, metrics, renderer, models=None) -> None:
    from jaxvllm.entrypoints.openai.disconnect import cancel_on_disconnect
    from jaxvllm.entrypoints.openai.request_body import parse_body

    responses = OpenAIServingResponses(engine, model_name, server_args, metrics, renderer, models=models)

    @app.post("/v1/responses")
    async def create_response(raw: Request):
        request = await parse_body(raw, ResponsesRequest)
        rid = responses.request_id(raw, "resp")
        return await cancel_on_disconnect(raw, responses.create_response(request, rid))

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str):
        return JSONResponse(responses.retrieve(response_id))
