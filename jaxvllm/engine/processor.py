"""Processor: turns a user's prompt and SamplingParams (or, for a pooling model, PoolingParams)
into a validated EngineCoreRequest.

Everything that can be rejected is rejected here, before the request reaches the engine
core, so a bad request never holds KV blocks or disturbs the others.
"""
from __future__ import annotations

import copy
import dataclasses
import random
import time

from jaxvllm.config import EngineConfig
from jaxvllm.engine.grammar_sandbox import GrammarSandbox
from jaxvllm.engine.messages import EngineCoreRequest
from jaxvllm.lora.peft_helper import read_adapter
from jaxvllm.lora.request import LoRARequest
from jaxvllm.pooling_params import PoolingParams
from jaxvllm.sampling_params import SamplingParams, is_int


def eos_token_id(tokenizer, hf_config) -> int | None:
    """The tokenizer's EOS id, else the model config's (its first, if it lists several)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
    return eos


class Processor:
    def __init__(self, config: EngineConfig, tokenizer, vocab_size: int, eos_token_id: int | None):
        self.max_model_len = config.scheduler.max_model_len
        self.model_config = config.model
        self.scheduling_policy = config.scheduler.scheduling_policy
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.grammar_sandbox = GrammarSandbox()  # its process starts with the first grammar
        # Seeds for requests without one: reproducible per engine seed, distinct per request.
        self._seed_rng = random.Random(config.model.seed)
        self.lora_config = config.lora
        self._loras: dict[int, LoRARequest] = {}  # adapters checked already, by lora_int_id

    def process_inputs(self, request_id: str, prompt, params: SamplingParams | PoolingParams,
                       arrival_time: float | None = None, priority: int = 0,
                       lora_request: LoRARequest | None = None) -> tuple[EngineCoreRequest, str | None]:
        """Returns the request and the prompt text (None when given as token ids)."""
        if lora_request is not None:
            self.check_lora(lora_request)
        if not (is_int(priority) and -2**63 <= priority < 2**63):
            raise ValueError(f"priority must be a 64-bit integer, got {priority!r}.")
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(f"Got priority {priority} but the scheduling policy is "
                             f"{self.scheduling_policy!r}; set scheduling_policy='priority'.")
        cache_salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        pooling = isinstance(params, PoolingParams)
        if pooling != (self.model_config.runner == "pooling"):
            raise ValueError("Pooling (embeddings, classification, scores) needs a model served with "
                             "runner='pooling' (--runner pooling)" if pooling else
                             "This model is served with runner='pooling' (--runner pooling): it embeds, "
                             "classifies and scores, and does not generate.")
        text, token_ids = self._tokenize(prompt)
        if pooling and params.truncate_prompt_tokens is not None:
            keep = self.max_model_len - 1 if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
            token_ids = token_ids[-keep:]
        if not token_ids:
            raise ValueError("The prompt must not be empty.")
        bad = [t for t in token_ids if not is_int(t) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids must lie in [0, {self.vocab_size}); got {bad[:5]}.")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"The prompt (length {len(token_ids)}) is longer than the maximum model "
                             f"length of {self.max_model_len} minus one generated token; shorten it "
                             f"or raise max_model_len.")
        if pooling:
            sampling, pooling_params, seed = None, self._check_pooling_params(params), 0
        else:
            sampling, pooling_params = self._check_params(params), None
            seed = sampling.seed if sampling.seed is not None else self._seed_rng.getrandbits(63)
        return EngineCoreRequest(
            request_id=request_id, prompt_token_ids=token_ids, sampling_params=sampling,
            eos_token_id=self.eos_token_id, sampling_seed=seed,
            arrival_time=arrival_time if arrival_time is not None else time.time(),
            priority=priority, cache_salt=cache_salt, pooling_params=pooling_params,
            lora_request=lora_request,
        ), text

    def check_lora(self, lora: LoRARequest) -> None:
        """The adapter's files and config, read once per lora_int_id (peft_helper.read_adapter);
        one id names one adapter for the engine's life, as in vLLM."""
        if not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(lora).__name__}.")
        if self.lora_config is None:
            raise ValueError("lora_request needs an engine started with enable_lora=True.")
        known = self._loras.get(lora.lora_int_id)
        if known is None:
            read_adapter(lora.lora_path, self.lora_config.max_lora_rank, lora.lora_name)
            self._loras[lora.lora_int_id] = lora
        elif (known.lora_name, known.lora_path) != (lora.lora_name, lora.lora_path):
            raise ValueError(f"lora_int_id {lora.lora_int_id} already names adapter {known.lora_name!r} "
                             f"({known.lora_path}); give {lora.lora_name!r} another id.")

    def _check_pooling_params(self, params: PoolingParams) -> PoolingParams:
        """The params with the model's pooler config filled in (the worker reads plain values).
        Pooling over every position (MEAN, CLS, ALL) computes the whole prompt: no prefix-cache
        read, since a cached page holds keys and values, not the hidden states it pools."""
        m, pooler = self.model_config, self.model_config.pooler_config
        if params.task in ("classify", "score", "token_classify") and m.convert != "classify":
            raise ValueError(f"task={params.task!r} needs a classification model (convert='classify'); "
                             f"this one is served with convert={m.convert!r}.")
        if params.task in ("embed", "token_embed") and m.convert != "embed":
            raise ValueError(f"task={params.task!r} needs an embedding model (convert='embed'); "
                             f"this one is served with convert={m.convert!r}.")
        dims = params.dimensions if params.dimensions is not None else pooler.dimensions
        if params.dimensions is not None:
            if m.convert != "embed":
                raise ValueError("dimensions applies to embedding models only.")
            if not m.is_matryoshka:
                raise ValueError(f"dimensions: model {m.name!r} does not support Matryoshka "
                                 f"representation; changing output dimensions would give poor embeddings.")
            if dims > m.hf_config.hidden_size:
                raise ValueError(f"dimensions must be at most the hidden size {m.hf_config.hidden_size}, "
                                 f"got {dims}.")
        pooling_type = ("ALL" if params.task in ("token_embed", "token_classify")
                        else params.pooling_type or pooler.pooling_type)
        return dataclasses.replace(
            params, dimensions=dims, pooling_type=pooling_type,
            normalize=pooler.normalize if params.normalize is None else params.normalize,
            use_activation=pooler.softmax if params.use_activation is None else params.use_activation,
            skip_reading_prefix_cache=pooling_type != "LAST")

    def _check_params(self, params: SamplingParams) -> SamplingParams:
        """Token ids in the params must exist in the model's vocabulary and a grammar must
        compile. Returns the params, copied with each bad word's token ids when there are
        bad words (vLLM's rule: each word as is and with a leading space, the latter only
        when it tokenizes differently into as many tokens)."""
        vocab = self.vocab_size
        for name, ids in (("stop_token_ids", params.stop_token_ids),
                          ("logit_bias", list(params.logit_bias or ())),
                          ("allowed_token_ids", params.allowed_token_ids or [])):
            if any(t >= vocab for t in ids):
                raise ValueError(f"{name} must lie in [0, {vocab}); got {[t for t in ids if t >= vocab][:5]}.")
        if params.structured_outputs is not None:
            self.grammar_sandbox.check(params.structured_outputs)  # rejected here, by name
        if not params.bad_words:
            return params
        words = []
        for word in params.bad_words:
            plain = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            words.append(plain)
            if spaced[0] != plain[0] and len(spaced) == len(plain):
                words.append(spaced)
        bad = [t for w in words for t in w if t >= vocab]
        if bad:
            raise ValueError(f"bad_words must tokenize to ids in [0, {vocab}); got {bad[:5]}.")
        params = copy.copy(params)
        params._bad_words_token_ids = words
        return params

    def tokenize(self, prompt) -> list[int]:
        """A prompt's token ids (the forms generate accepts), without building a request."""
        return self._tokenize(prompt)[1]

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):  # vLLM's TextPrompt / TokensPrompt
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return None, list(prompt)
        raise ValueError(f"prompt must be a string, a list of token ids or a dict with 'prompt' or "
                         f"'prompt_token_ids'; got {type(prompt).__name__}.")
