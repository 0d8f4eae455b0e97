"""POST /v1/chat/completions: the conversation (and the request's tools) goes through the
chat template (chat_utils.py), then one engine request sampled n times; a JSON response or
an SSE stream of deltas. With tools or a reasoning parser, each choice's text is split into
reasoning, content and tool calls (message_parser.py, tool_choice.py)."""
from __future__ import annotations

import asyncio
from collections import defaultdict

from fastapi.responses import JSONResponse, StreamingResponse

from jaxvllm.entrypoints.openai.errors import APIError, error_body
from jaxvllm.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs_json
from jaxvllm.entrypoints.openai.message_parser import MessageParser
from jaxvllm.entrypoints.openai.protocol import ChatCompletionRequest
from jaxvllm.entrypoints.openai.protocol_replies import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessageReply,
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
    UsageInfo,
)
from jaxvllm.entrypoints.openai.reasoning import ReasoningParserManager
from jaxvllm.entrypoints.openai.serving_completion import sse
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing, engine_error
from jaxvllm.entrypoints.openai.tool_choice import ToolPlan, check_tools, plan_tools
from jaxvllm.sampling_params import RequestOutputKind


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(self, request: ChatCompletionRequest, request_id: str):
        lora = self.check_model(request.model)
        self.check_engine()
        if request.stream_options is not None and not request.stream:
            raise APIError("stream_options can only be set when stream is true.", 400, "stream_options")
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError("top_logprobs requires logprobs to be true.", 400, "top_logprobs")
        self.check_logprobs(request.top_logprobs, "top_logprobs")
        self.check_fan_out(request.n)
        if request.tools:
            await asyncio.to_thread(check_tools, request.tools)
        plan = plan_tools(request, self.server_args, self.tokenizer)
        ids = await self.chat_renderer.render(
            request.messages, request.add_generation_prompt, request.continue_final_message,
            request.chat_template_kwargs, request.chat_template, plan.tools)
        self.validate_prompt(ids, "messages")
        budget, budget_param = self.requested_budget(request)
        extra = {}
        if plan.structured_outputs is not None:
            extra["structured_outputs"] = plan.structured_outputs
        if plan.parser is not None and plan.parser.keeps_special_tokens:
            extra["skip_special_tokens"] = False
        params = self.sampling_params(
            request, budget_param, max_tokens=self.max_tokens(budget, len(ids), budget_param),
            logprobs=(request.top_logprobs or 0) if request.logprobs else None,
            prompt_logprobs=request.prompt_logprobs,
            output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
            **extra)
        make_parser = self.message_parser_factory(plan, ids)
        gen = self.generate_all([{"prompt_token_ids": ids}], [params], request_id, request.priority, lora)
        if request.stream:
            return StreamingResponse(self._stream(request, request_id, len(ids), gen, make_parser),
                                     media_type="text/event-stream")
        try:
            reply = await self._full(request, request_id, len(ids), gen, make_parser)
        except Exception as e:
            raise engine_error(e) from e
        return JSONResponse(reply.dump())

    def message_parser_factory(self, plan: ToolPlan, prompt_ids: list[int]):
        """A new MessageParser per choice, or None when the text is all content."""
        name = self.server_args.reasoning_parser
        if plan.parser is None and name is None:
            return None
        reasoning = ReasoningParserManager.get_reasoning_parser(name)(self.tokenizer) if name else None
        opened = reasoning is not None and reasoning.starts_in_reasoning(
            self.tokenizer.decode(prompt_ids[-8:]))
        return lambda: MessageParser(reasoning, opened, plan.parser, plan.tools, plan.max_calls)

    def _logprobs(self, request, o):
        if not request.logprobs:
            return None
        return chat_logprobs(self.tokenizer, o.token_ids, o.logprobs or [{}] * len(o.token_ids),
                             request.top_logprobs or 0)

    @staticmethod
    def _finish_reason(reason: str | None, called_tools: bool) -> str | None:
        return "tool_calls" if called_tools and reason == "stop" else reason

    async def _full(self, request, request_id, num_prompt, gen, make_parser) -> ChatCompletionResponse:
        finals, prompt_lps, kv_transfer_params = {}, None, None
        async for _, out in gen:
            prompt_lps = prompt_lps or getattr(out, "prompt_logprobs", None)
            kv_transfer_params = getattr(out, "kv_transfer_params", None) or kv_transfer_params
            for o in out.outputs:
                finals[o.index] = o
        choices = []
        for i, o in sorted(finals.items()):
            message = ChatMessageReply(role="assistant", content=o.text)
            if make_parser is not None:
                parsed = make_parser().full(o.text)
                message = ChatMessageReply(
                    role="assistant", content=parsed.content,
                    tool_calls=[ToolCall(**c) for c in parsed.tool_calls],
                    **({"reasoning_content": parsed.reasoning}
                       if self.server_args.reasoning_parser else {}))
            choices.append(ChatCompletionResponseChoice(
                index=i, message=message, logprobs=self._logprobs(request, o),
                finish_reason=self._finish_reason(o.finish_reason, bool(message.tool_calls)),
                stop_reason=o.stop_reason))
        reply = ChatCompletionResponse(
            id=request_id, created=self.created(), model=self.model_name, choices=choices,
            usage=UsageInfo.of(num_prompt, sum(len(o.token_ids) for o in finals.values())))
        if request.prompt_logprobs is not None:
            reply.prompt_logprobs = prompt_logprobs_json(self.tokenizer, prompt_lps)
        if kv_transfer_params is not None:
            reply.kv_transfer_params = kv_transfer_params
        return reply

    async def _stream(self, request, request_id, num_prompt, gen, make_parser):
        def chunk(choice=None, usage=None) -> str:
            reply = ChatCompletionStreamResponse(id=request_id, created=created, model=self.model_name,
                                                 choices=[choice] if choice else [])
            if usage is not None:
                reply.usage = usage
            return sse(reply.dump())

        created = self.created()
        opts = request.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        generated = defaultdict(int)
        parsers = {i: make_parser() for i in range(request.n)} if make_parser else {}
        try:
            for i in range(request.n):  # the role first, as OpenAI streams it
                yield chunk(ChatCompletionStreamChoice(
                    index=i, delta=DeltaMessage(role="assistant", content=""), logprobs=None,
                    finish_reason=None), UsageInfo.of(num_prompt, 0) if continuous else None)
            async for _, out in gen:
                for o in out.outputs:
                    generated[o.index] += len(o.token_ids)
                    if not o.text and o.finish_reason is None and not o.token_ids:
                        continue
                    delta, called = DeltaMessage(), False
                    if o.index in parsers:
                        parsed = parsers[o.index].feed(o.text, final=o.finish_reason is not None)
                        called = parsers[o.index].called_tools
                        if parsed.content:
                            delta.content = parsed.content
                        if parsed.reasoning:
                            delta.reasoning_content = parsed.reasoning
                        if parsed.tool_calls:
                            delta.tool_calls = [DeltaToolCall(**tc) for tc in parsed.tool_calls]
                        if not parsed and o.finish_reason is None and not request.logprobs:
                            continue  # held back (a marker, or a call's name not yet whole)
                    elif o.text:
                        delta.content = o.text
                    yield chunk(ChatCompletionStreamChoice(
                        index=o.index, delta=delta, logprobs=self._logprobs(request, o),
                        finish_reason=self._finish_reason(o.finish_reason, called),
                        stop_reason=o.stop_reason),
                        UsageInfo.of(num_prompt, generated[o.index]) if continuous else None)
            if include_usage:
                yield chunk(usage=UsageInfo.of(num_prompt, sum(generated.values())))
        except Exception as e:
            err = engine_error(e)
            yield sse(error_body(err.message, err.status, err.param))
        yield "data: [DONE]\n\n"
