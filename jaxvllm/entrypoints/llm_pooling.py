"""LLM's pooling methods (vLLM's names and outputs), for a model served with runner="pooling":
`encode` (the pooled data as it is), `embed`, `classify` and `score` (text pairs: the cosine of
their embeddings for an embedding model, the cross-encoder's output for a one-label
classifier). Each prompt is one pooling request through the engine's scheduler."""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxvllm.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from jaxvllm.pooling_params import PoolingParams
from jaxvllm.vllm_compat import POOLING_REFUSED, refuse


def _as_list(prompts) -> list:
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


class LLMPooling:
    def encode(self, prompts, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool | Callable[..., tqdm] = True,
               lora_request=None, pooling_task: str | None = None,
               tokenization_kwargs: dict | None = None) -> list[PoolingRequestOutput]:
        """The pooled data of each prompt (PoolingOutput.data: a vector, or one per token for
        pooling_task token_embed / token_classify)."""
        refuse({"lora_request": lora_request, "tokenization_kwargs": tokenization_kwargs},
               POOLING_REFUSED, "LLM.encode")
        prompts = _as_list(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            pooling_params = [pooling_params or PoolingParams()] * len(prompts)
        if len(pooling_params) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(pooling_params)} pooling_params.")
        task = pooling_task or ("classify" if self.llm_engine.config.model.convert == "classify" else "embed")
        overrides = {"task": task}
        if truncate_prompt_tokens is not None:
            overrides["truncate_prompt_tokens"] = truncate_prompt_tokens
        params = [dataclasses.replace(p, **overrides) for p in pooling_params]
        return self._run_requests(prompts, params, use_tqdm)

    def embed(self, prompts, *, truncate_prompt_tokens: int | None = None, use_tqdm=True,
              pooling_params=None, lora_request=None, tokenization_kwargs=None) -> list[EmbeddingRequestOutput]:
        outputs = self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                              use_tqdm=use_tqdm, lora_request=lora_request, pooling_task="embed",
                              tokenization_kwargs=tokenization_kwargs)
        return [EmbeddingRequestOutput.from_base(o) for o in outputs]

    def classify(self, prompts, *, pooling_params=None, use_tqdm=True, lora_request=None,
                 tokenization_kwargs=None) -> list[ClassificationRequestOutput]:
        outputs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, lora_request=lora_request,
                              pooling_task="classify", tokenization_kwargs=tokenization_kwargs)
        return [ClassificationRequestOutput.from_base(o) for o in outputs]

    def score(self, data_1, data_2, /, *, truncate_prompt_tokens: int | None = None, use_tqdm=True,
              pooling_params: PoolingParams | None = None, lora_request=None,
              tokenization_kwargs=None, chat_template=None) -> list[ScoringRequestOutput]:
        """Scores of text pairs: data_1 (one text, scored against each of data_2, or one per
        text of data_2) and data_2."""
        refuse({"lora_request": lora_request, "tokenization_kwargs": tokenization_kwargs},
               POOLING_REFUSED, "LLM.score")
        if chat_template is not None:
            raise ValueError("chat_template is not supported by jaxvllm's LLM.score: pairs are "
                             "tokenized as the tokenizer joins them.")
        data_1 = [data_1] if isinstance(data_1, str) else list(data_1)
        data_2 = [data_2] if isinstance(data_2, str) else list(data_2)
        if len(data_1) == 1:
            data_1 = data_1 * len(data_2)
        if not data_2 or len(data_1) != len(data_2):
            raise ValueError(f"score needs one data_1 text, or as many as data_2 ({len(data_2)}); "
                             f"got {len(data_1)}.")
        params = pooling_params or PoolingParams()
        model = self.llm_engine.config.model
        if model.convert == "embed":
            embeds = self.encode(data_1 + data_2, dataclasses.replace(params, normalize=True),
                                 truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
                                 pooling_task="embed")
            n = len(data_1)
            return [ScoringRequestOutput.from_base(PoolingRequestOutput(
                f"score-{a.request_id}", PoolingOutput(np.asarray(float(a.outputs.data @ b.outputs.data),
                                                                  np.float32)),
                a.prompt_token_ids + b.prompt_token_ids)) for a, b in zip(embeds[:n], embeds[n:])]
        if getattr(model.hf_config, "num_labels", 1) != 1:
            raise ValueError(f"score needs an embedding model or a one-label classifier (a cross-encoder); "
                             f"this one has {model.hf_config.num_labels} labels. Use classify.")
        tokenizer = self.get_tokenizer()
        pairs = [{"prompt_token_ids": tokenizer(a, b)["input_ids"]} for a, b in zip(data_1, data_2)]
        outputs = self.encode(pairs, dataclasses.replace(params, task="score"),
                              truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
                              pooling_task="score")
        return [ScoringRequestOutput.from_base(dataclasses.replace(
            o, outputs=PoolingOutput(o.outputs.data.reshape(())))) for o in outputs]
