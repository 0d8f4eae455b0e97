"""POST /v1/chat/completions: the conversation goes through the chat template
(chat_utils.py), then one engine request sampled n times; a JSON response or an SSE
stream of deltas."""
from __future__ import annotations

from collections import defaultdict

from fastapi.responses import JSONResponse, StreamingResponse

from jaxvllm.entrypoints.openai.errors import APIError, error_body
from jaxvllm.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs_json
from jaxvllm.entrypoints.openai.protocol import ChatCompletionRequest
from jaxvllm.entrypoints.openai.serving_completion import sse
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing, engine_error, usage
from jaxvllm.sampling_params import RequestOutputKind


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(self, request: ChatCompletionRequest, request_id: str):
        self.check_model(request.model)
        self.check_engine()
        if request.stream_options is not None and not request.stream:
            raise APIError("stream_options can only be set when stream is true.", 400, "stream_options")
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError("top_logprobs requires logprobs to be true.", 400, "top_logprobs")
        self.check_logprobs(request.top_logprobs, "top_logprobs")
        self.check_fan_out(request.n)
        ids = await self.chat_renderer.render(
            request.messages, request.add_generation_prompt, request.continue_final_message,
            request.chat_template_kwargs, request.chat_template)
        self.validate_prompt(ids, "messages")
        budget, budget_param = self.requested_budget(request)
        params = self.sampling_params(
            request, budget_param, max_tokens=self.max_tokens(budget, len(ids), budget_param),
            logprobs=(request.top_logprobs or 0) if request.logprobs else None,
            prompt_logprobs=request.prompt_logprobs,
            output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY)
        gen = self.generate_all([{"prompt_token_ids": ids}], [params], request_id, request.priority)
        if request.stream:
            return StreamingResponse(self._stream(request, request_id, len(ids), gen),
                                     media_type="text/event-stream")
        try:
            return JSONResponse(await self._full(request, request_id, len(ids), gen))
        except Exception as e:
            raise engine_error(e) from e

    def _logprobs(self, request, o):
        if not request.logprobs:
            return None
        return chat_logprobs(self.tokenizer, o.token_ids, o.logprobs or [{}] * len(o.token_ids),
                             request.top_logprobs or 0)

    def _head(self, request_id: str, obj: str) -> dict:
        return {"id": request_id, "object": obj, "created": self.created(), "model": self.model_name}

    async def _full(self, request, request_id, num_prompt, gen) -> dict:
        finals, prompt_lps = {}, None
        async for _, out in gen:
            prompt_lps = prompt_lps or getattr(out, "prompt_logprobs", None)
            for o in out.outputs:
                finals[o.index] = o
        choices = [{"index": i, "message": {"role": "assistant", "content": o.text},
                    "logprobs": self._logprobs(request, o), "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason} for i, o in sorted(finals.items())]
        num_gen = sum(len(o.token_ids) for o in finals.values())
        extra = ({"prompt_logprobs": prompt_logprobs_json(self.tokenizer, prompt_lps)}
                 if request.prompt_logprobs is not None else {})
        return {**self._head(request_id, "chat.completion"), "choices": choices,
                "usage": usage(num_prompt, num_gen), **extra}

    async def _stream(self, request, request_id, num_prompt, gen):
        head = self._head(request_id, "chat.completion.chunk")
        opts = request.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        generated = defaultdict(int)
        try:
            for i in range(request.n):  # the role first, as OpenAI streams it
                chunk = {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                              "logprobs": None, "finish_reason": None}]}
                if continuous:
                    chunk["usage"] = usage(num_prompt, 0)
                yield sse(chunk)
            async for _, out in gen:
                for o in out.outputs:
                    generated[o.index] += len(o.token_ids)
                    if not o.text and o.finish_reason is None and not o.token_ids:
                        continue
                    chunk = {**head, "choices": [{
                        "index": o.index, "delta": {"content": o.text} if o.text else {},
                        "logprobs": self._logprobs(request, o), "finish_reason": o.finish_reason,
                        "stop_reason": o.stop_reason}]}
                    if continuous:
                        chunk["usage"] = usage(num_prompt, generated[o.index])
                    yield sse(chunk)
            if include_usage:
                yield sse({**head, "choices": [], "usage": usage(num_prompt, sum(generated.values()))})
        except Exception as e:
            err = engine_error(e)
            yield sse(error_body(err.message, err.status, err.param))
        yield "data: [DONE]\n\n"
