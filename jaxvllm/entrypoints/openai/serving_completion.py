"""POST /v1/completions: one engine request per prompt (each sampled n times), merged
into one response or one SSE stream. Choice i*n + j is sample j of prompt i (OpenAI's order)."""
from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from fastapi.responses import JSONResponse, StreamingResponse

from jaxvllm.beam_search import beam_search_async
from jaxvllm.entrypoints.openai.errors import APIError, error_body
from jaxvllm.entrypoints.openai.logprobs import completion_logprobs, prompt_logprobs_json
from jaxvllm.entrypoints.openai.protocol import CompletionRequest
from jaxvllm.entrypoints.openai.protocol_replies import CompletionResponse, CompletionResponseChoice, UsageInfo
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing, engine_error
from jaxvllm.sampling_params import BeamSearchParams, RequestOutputKind


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIServingCompletion(OpenAIServing):
    async def _prompts(self, request: CompletionRequest) -> list[tuple[str, list[int], str]]:
        """(text, token ids, field path) per prompt, for every prompt form clients send;
        tokenized off the event loop."""
        p = request.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)) or not p:
            p = [p]
        self.check_fan_out(request.n, len(p))
        out = []
        for i, one in enumerate(p):
            param = "prompt" if len(p) == 1 else f"prompt[{i}]"
            if isinstance(one, str):
                ids = await asyncio.to_thread(self.tokenizer.encode, one,
                                              add_special_tokens=request.add_special_tokens)
            else:
                ids = list(one)
                self.validate_prompt(ids, param)
                one = await asyncio.to_thread(self.tokenizer.decode, ids)
            self.validate_prompt(ids, param)
            out.append((one, ids, param))
        return out

    async def create_completion(self, request: CompletionRequest, request_id: str):
        lora = self.check_model(request.model)
        self.check_engine()
        if request.stream_options is not None and not request.stream:
            raise APIError("stream_options can only be set when stream is true.", 400, "stream_options")
        if request.suffix:
            raise APIError("suffix is not supported.", 400, "suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise APIError("best_of is not supported; use n.", 400, "best_of")
        self.check_logprobs(request.logprobs, "logprobs")
        prompts = await self._prompts(request)
        budget, budget_param = self.requested_budget(request)
        if request.use_beam_search:
            return JSONResponse(await self._beam_search(request, request_id, prompts, budget,
                                                        budget_param))
        echo_logprobs = request.echo and request.logprobs is not None
        kind = RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY
        params = [self.sampling_params(
            request, budget_param, max_tokens=self.max_tokens(budget, len(ids), budget_param),
            logprobs=request.logprobs,
            prompt_logprobs=request.logprobs if echo_logprobs else request.prompt_logprobs,
            output_kind=kind) for _, ids, _ in prompts]
        engine_prompts = [{"prompt": text, "prompt_token_ids": ids} for text, ids, _ in prompts]
        gen = self.generate_all(engine_prompts, params, request_id, request.priority, lora)
        if request.stream:
            return StreamingResponse(self._stream(request, request_id, prompts, gen),
                                     media_type="text/event-stream")
        try:
            return JSONResponse(await self._full(request, request_id, prompts, gen))
        except Exception as e:
            raise engine_error(e) from e

    async def _beam_search(self, request, request_id, prompts, budget, budget_param) -> dict:
        """vLLM's use_beam_search: the n best of n beams per prompt, returned when done."""
        if request.stream:
            raise APIError("use_beam_search does not support stream.", 400, "stream")
        choices, num_gen = [], 0
        for i, (text, ids, _) in enumerate(prompts):
            try:
                params = BeamSearchParams(
                    beam_width=request.n, max_tokens=self.max_tokens(budget, len(ids), budget_param),
                    ignore_eos=request.ignore_eos, temperature=request.temperature or 0.0,
                    length_penalty=request.length_penalty)
            except ValueError as e:
                raise APIError(str(e).replace("beam_width", "n", 1), 400, "n") from e
            try:
                out = await beam_search_async(self.engine, ids, params, f"{request_id}-{i}")
            except Exception as e:
                raise engine_error(e) from e
            for j, seq in enumerate(out.sequences):
                generated = seq.tokens[len(ids):]
                num_gen += len(generated)
                choices.append(CompletionResponseChoice(
                    index=i * request.n + j, text=(text if request.echo else "") + self.tokenizer.decode(
                        generated, skip_special_tokens=True),
                    logprobs=None, finish_reason=seq.finish_reason, stop_reason=None))
        return self._reply(request_id, self.created(), choices,
                           UsageInfo.of(sum(len(ids) for _, ids, _ in prompts), num_gen)).dump()

    def _logprobs(self, request, prompt, o, prompt_lps, first: bool, offset: int):
        """Legacy logprobs of one (delta) output; with echo, the prompt's come first."""
        if request.logprobs is None:
            return None
        text, ids, _ = prompt
        parts = []
        if request.echo and first:
            lps = prompt_lps if prompt_lps is not None else [None] * len(ids)
            parts.append(completion_logprobs(self.tokenizer, ids, lps, request.logprobs, offset))
            offset += len(text)
        parts.append(completion_logprobs(self.tokenizer, o.token_ids, o.logprobs or
                                         [{}] * len(o.token_ids), request.logprobs, offset))
        return {k: sum((p[k] for p in parts), []) for k in parts[0]}

    def _reply(self, request_id: str, created: int, choices, usage=None) -> CompletionResponse:
        reply = CompletionResponse(id=request_id, created=created, model=self.model_name,
                                   choices=choices)
        if usage is not None:
            reply.usage = usage
        return reply

    async def _full(self, request, request_id, prompts, gen) -> dict:
        finals, prompt_lps, kv_transfer_params = {}, {}, None
        async for i, out in gen:
            prompt_lps.setdefault(i, getattr(out, "prompt_logprobs", None))
            kv_transfer_params = getattr(out, "kv_transfer_params", None) or kv_transfer_params
            for o in out.outputs:
                finals[i * request.n + o.index] = (i, o)
        choices = []
        for idx in sorted(finals):
            i, o = finals[idx]
            choices.append(CompletionResponseChoice(
                index=idx, text=(prompts[i][0] if request.echo else "") + o.text,
                logprobs=self._logprobs(request, prompts[i], o, prompt_lps.get(i), True, 0),
                finish_reason=o.finish_reason, stop_reason=o.stop_reason))
            if request.prompt_logprobs is not None:
                choices[-1].prompt_logprobs = prompt_logprobs_json(self.tokenizer, prompt_lps.get(i))
        num_prompt = sum(len(ids) for _, ids, _ in prompts)
        num_gen = sum(len(o.token_ids) for _, o in finals.values())
        reply = self._reply(request_id, self.created(), choices, UsageInfo.of(num_prompt, num_gen))
        if kv_transfer_params is not None:
            reply.kv_transfer_params = kv_transfer_params
        return reply.dump()

    async def _stream(self, request, request_id, prompts, gen):
        created = self.created()
        opts = request.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)
        generated = defaultdict(int)   # choice -> tokens so far
        text_len = defaultdict(int)    # choice -> characters sent so far (text_offset)
        try:
            async for i, out in gen:
                for o in out.outputs:
                    idx = i * request.n + o.index
                    first = idx not in text_len
                    text = (prompts[i][0] if request.echo and first else "") + o.text
                    lps = self._logprobs(request, prompts[i], o, getattr(out, "prompt_logprobs", None),
                                         first, text_len[idx])
                    generated[idx] += len(o.token_ids)
                    text_len[idx] += len(text)
                    if not text and o.finish_reason is None and not o.token_ids:
                        continue
                    choice = CompletionResponseChoice(index=idx, text=text, logprobs=lps,
                                                      finish_reason=o.finish_reason,
                                                      stop_reason=o.stop_reason)
                    yield sse(self._reply(request_id, created, [choice], UsageInfo.of(
                        len(prompts[i][1]), generated[idx]) if continuous else None).dump())
            if include_usage:
                yield sse(self._reply(request_id, created, [], UsageInfo.of(
                    sum(len(ids) for _, ids, _ in prompts), sum(generated.values()))).dump())
        except Exception as e:  # the status line is gone: report in the stream
            err = engine_error(e)
            yield sse(error_body(err.message, err.status, err.param))
        yield "data: [DONE]\n\n"
