"""PoolingParams: what a pooling request returns (vLLM's `vllm/pooling_params.py`, its field
names and defaults): the prompt is prefilled, never decoded, and its hidden states pooled.

Fields left at None take the model's pooler configuration (config.PoolerConfig), which the
front end resolves per request (engine/processor.py) so the worker reads plain values.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxvllm.sampling_params import RequestOutputKind, is_int

# vLLM's pooling tasks: one vector per prompt (embed, classify, score) or per token.
POOLING_TASKS = ("embed", "classify", "score", "token_embed", "token_classify")
POOLING_TYPES = ("LAST", "MEAN", "CLS", "ALL")


@dataclass
class PoolingParams:
    truncate_prompt_tokens: int | None = None
    """Keep only the prompt's last k tokens (-1: as many as max_model_len allows)."""
    dimensions: int | None = None
    """Embed: keep the first k dimensions, then normalize (Matryoshka models only)."""
    normalize: bool | None = None
    """Embed: L2-normalize the vector (default: the pooler config's, True)."""
    use_activation: bool | None = None
    """Classify / score: softmax over the labels (sigmoid for one label); False: raw logits."""
    task: str | None = None
    """Set by LLM.embed / classify / score / encode and the server's endpoints."""
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY
    pooling_type: str | None = None
    """LAST, MEAN, CLS or ALL for this request (a jaxvllm addition: vLLM fixes it per model);
    None: the model's pooler config."""
    # Set by the front end (engine/processor.py), not by users: whether the request must
    # compute its whole prompt (its pooler reads every position, not only the last).
    skip_reading_prefix_cache: bool | None = None

    def __post_init__(self) -> None:
        if self.truncate_prompt_tokens is not None and not (
                is_int(self.truncate_prompt_tokens) and (self.truncate_prompt_tokens >= 1
                                                         or self.truncate_prompt_tokens == -1)):
            raise ValueError(f"truncate_prompt_tokens must be a positive integer or -1, "
                             f"got {self.truncate_prompt_tokens!r}.")
        if self.dimensions is not None and not (is_int(self.dimensions) and self.dimensions >= 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}.")
        for name in ("normalize", "use_activation"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}.")
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}.")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {POOLING_TASKS}, got {self.task!r}.")
