"""What the completion, chat and tokenizer endpoints share: model check, request ids,
prompt validation against the model's limits, running several generators at once, and
aborting whatever is left when the client goes away."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import AsyncIterator

from fastapi import Request

from jaxvllm.engine.exceptions import EngineDeadError, EngineGenerateError, EngineSleepingError
from jaxvllm.entrypoints.openai.chat_utils import ChatRenderer
from jaxvllm.entrypoints.openai.errors import APIError, param_of_value_error
from jaxvllm.entrypoints.openai.protocol import SamplingRequestBase
from jaxvllm.entrypoints.openai.server_args import ServerArgs
from jaxvllm.entrypoints.openai.serving_models import OpenAIServingModels
from jaxvllm.lora.request import LoRARequest
from jaxvllm.outputs import RequestOutput
from jaxvllm.sampling_params import SamplingParams

MAX_LOGPROBS = 20  # OpenAI's limit on top logprobs
logger = logging.getLogger(__name__)


class OpenAIServing:
    def __init__(self, engine, model_name: str, server_args: ServerArgs, metrics=None,
                 chat_renderer: ChatRenderer | None = None, models: OpenAIServingModels | None = None):
        """models: the registry of served models the server's endpoints share."""
        self.engine = engine
        self.model_name = model_name
        self.server_args = server_args
        self.chat_renderer = chat_renderer
        self.tokenizer = engine.get_tokenizer()
        self.max_model_len = engine.vllm_config.scheduler.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        self.metrics = metrics
        self._background: set[asyncio.Task] = set()
        self.models = models or OpenAIServingModels(model_name, server_args)

    def check_engine(self) -> None:
        """A dead engine fails the request now (500), a sleeping one too (503), not as a 200
        stream of errors."""
        if self.engine.errored:
            raise APIError(str(EngineDeadError()), 500)
        if self.engine.sleeping:
            raise APIError(str(EngineSleepingError()), 503)

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's `model` names (None: the base model); 404 if neither."""
        return self.models.resolve(model)

    def check_fan_out(self, n: int, num_prompts: int = 1) -> None:
        """The deployment's caps on samples per prompt and prompts per request."""
        limits = self.server_args
        if isinstance(n, int) and n > limits.max_n:
            raise APIError(f"n must be at most {limits.max_n} on this server, got {n}.", 400, "n")
        if num_prompts > limits.max_prompts_per_request:
            raise APIError(f"prompt may hold at most {limits.max_prompts_per_request} prompts on "
                           f"this server, got {num_prompts}.", 400, "prompt")

    @staticmethod
    def request_id(raw_request: Request, prefix: str) -> str:
        return f"{prefix}-{raw_request.headers.get('x-request-id') or uuid.uuid4().hex}"

    @staticmethod
    def created() -> int:
        return int(time.time())

    def validate_prompt(self, token_ids: list[int], param: str) -> None:
        if not token_ids:
            raise APIError(f"{param} must not be empty.", 400, param)
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(f"{param} holds token ids outside [0, {self.vocab_size}): {bad[:5]}.",
                           400, param)
        if len(token_ids) >= self.max_model_len:
            raise APIError(f"This model's maximum context length is {self.max_model_len} tokens, "
                           f"but {param} has {len(token_ids)} tokens (at least one must be left "
                           f"to generate).", 400, param)

    @staticmethod
    def requested_budget(request) -> tuple[int | None, str]:
        """max_completion_tokens (OpenAI's current name) wins over max_tokens."""
        if request.max_completion_tokens is not None:
            return request.max_completion_tokens, "max_completion_tokens"
        return request.max_tokens, "max_tokens"

    def max_tokens(self, requested: int | None, prompt_len: int, param: str) -> int:
        """The requested budget, or what is left of the context; more than fits is a 400."""
        left = self.max_model_len - prompt_len
        if requested is None:
            return left
        if requested > left:
            raise APIError(f"This model's maximum context length is {self.max_model_len} tokens. "
                           f"However, you requested {requested + prompt_len} tokens ({prompt_len} "
                           f"in the prompt, {requested} for {param}). Please reduce the length.",
                           400, param)
        return requested

    @staticmethod
    def check_logprobs(value: int | None, param: str) -> None:
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise APIError(f"{param} must be in [0, {MAX_LOGPROBS}], got {value}.", 400, param)

    @staticmethod
    def sampling_params(request: SamplingRequestBase, max_tokens_param: str, **kwargs
                        ) -> SamplingParams:
        try:
            return request.to_sampling_params(**kwargs)
        except ValueError as e:
            raise APIError(str(e), 400,
                           param_of_value_error(str(e), {"max_tokens": max_tokens_param})) from e

    async def generate_all(self, prompts: list[dict], params: list[SamplingParams], request_id: str,
                           priority: int = 0, lora_request: LoRARequest | None = None
                           ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) from one engine request per prompt, as they arrive. Closing
        or cancelling this iterator aborts every request that has not finished."""
        # Unique even when clients reuse an x-request-id.
        ids = [f"{request_id}-{i}-{uuid.uuid4().hex[:8]}" for i in range(len(prompts))]
        gens = [self.engine.generate(p, sp, rid, priority=priority, lora_request=lora_request)
                for p, sp, rid in zip(prompts, params, ids)]
        pending = {asyncio.ensure_future(anext(g)): i for i, g in enumerate(gens)}
        unfinished = set(ids)
        self.models.start(lora_request, request_id)
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    try:
                        out = fut.result()
                    except StopAsyncIteration:
                        continue
                    if out.finished:
                        unfinished.discard(ids[i])
                    pending[asyncio.ensure_future(anext(gens[i]))] = i
                    yield i, out
        except ValueError as e:
            raise APIError(str(e), 400, param_of_value_error(str(e))) from e
        finally:
            self.models.finish(lora_request, request_id)
            for fut in pending:
                fut.cancel()
            if unfinished and not self.engine.errored:
                self._abort_detached(sorted(unfinished))

    def _abort_detached(self, ids: list[str]) -> None:
        """Abort in a task of its own: this runs while the caller is being cancelled, and an
        await here could itself be cancelled before the engine hears of it."""
        if self.metrics is not None:
            self.metrics.aborted_by_server.inc(len(ids))

        async def abort():
            try:
                await self.engine.abort(ids)
            except EngineDeadError:
                pass
        task = asyncio.get_running_loop().create_task(abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def engine_error(e: Exception) -> APIError:
    """Failures inside the engine are the server's fault (500), not the client's; the
    client reads what happened, never Python's internals (those go to the log)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, EngineSleepingError):  # /sleep won the race to the engine core
        return APIError(str(e), 503)
    if isinstance(e, EngineGenerateError) and str(e).startswith("structured_outputs:"):
        return APIError(str(e), 400, "structured_outputs")  # the request's grammar failed midway
    if isinstance(e, (EngineDeadError, EngineGenerateError)):
        return APIError(str(e), 500)
    logger.error("Request failed: %s: %s", type(e).__name__, e)
    return APIError("The server failed to complete this request; see its log.", 500)
