"""`speculative_config` as vLLM takes it (a dict, or its JSON on the command line) resolved into
the SpeculativeConfig section, and the engine features speculative decoding does not combine
with yet, refused by name."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from jaxvllm.config.json_section import section_fields

METHODS = ("ngram", "suffix", "draft_model", "eagle3")
DRAFT_METHODS = ("draft_model", "eagle3")  # a model of their own, speculative_config.model
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's `speculative_config`): a proposer drafts up to
    `num_speculative_tokens` tokens per request per step, the target model verifies them in
    one forward and the rejection sampler keeps the target's distribution (worker/spec_decode).
    ngram: prompt lookup, the longest suffix n-gram of prompt_lookup_min..max tokens that
    appeared earlier in the request proposes the tokens that followed it (vLLM's defaults:
    one bound unset takes the other's value, both unset are 5).
    suffix: suffix decoding over the request's prompt and the responses of it and of the last
    suffix_decoding_max_cached_requests requests, matched up to suffix_decoding_max_tree_depth
    tokens back; a match of m tokens drafts up to m * suffix_decoding_max_spec_factor tokens,
    while the draft's path probability stays >= suffix_decoding_min_token_prob (vLLM's names
    and defaults; num_speculative_tokens unset: the tree depth, at most 16 here).
    draft_model: `model`, a smaller checkpoint with the target's vocabulary, runs in the same
    worker on the same mesh, its KV in the target's pool, and drafts greedily, k tokens per
    step in one compiled program (worker/spec_decode/draft_model.py)."""
    method: str = "ngram"
    num_speculative_tokens: int = 4
    model: str | None = None
    """The draft model of method draft_model (a path or hub id, resolved to a local path)."""
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1


def parse_speculative_config(value) -> SpeculativeConfig | None:
    """A SpeculativeConfig, a dict of its fields, or their JSON (--speculative-config)."""
    value = section_fields(value, SpeculativeConfig, "speculative_config")
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if "method" not in value and value.get("model") is not None:  # vLLM: a model alone is a draft model
        value = dict(value, method="draft_model")
    if value.get("method") == "suffix" and "num_speculative_tokens" not in value:  # vLLM: the tree depth
        depth = value.get("suffix_decoding_max_tree_depth", SpeculativeConfig.suffix_decoding_max_tree_depth)
        value = dict(value, num_speculative_tokens=min(depth, MAX_SPECULATIVE_TOKENS) if type(depth) is int else depth)
    if "method" not in value or "num_speculative_tokens" not in value:
        raise ValueError("speculative_config needs 'method' and 'num_speculative_tokens'.")
    lookup_min, lookup_max = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if lookup_min is None:
        lookup_min = 5 if lookup_max is None else lookup_max
    if lookup_max is None:
        lookup_max = lookup_min
    return SpeculativeConfig(**dict(value, prompt_lookup_min=lookup_min, prompt_lookup_max=lookup_max))


def verify_speculative(config) -> None:
    spec = config.speculative
    if spec is None:
        return
    if spec.method not in METHODS:
        raise ValueError(f"speculative_config.method must be one of {METHODS}, got {spec.method!r}.")
    for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                 "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests"):
        if type(getattr(spec, name)) is not int:
            raise ValueError(f"speculative_config.{name} must be an integer, got {getattr(spec, name)!r}.")
    if not 1 <= spec.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"speculative_config.num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                         f"got {spec.num_speculative_tokens}.")
    for name, low, high in (("suffix_decoding_max_tree_depth", 1, 1024),
                            ("suffix_decoding_max_cached_requests", 0, 10**7),
                            ("suffix_decoding_max_spec_factor", 0, 1e6), ("suffix_decoding_min_token_prob", 0, 1)):
        value = getattr(spec, name)
        if type(value) not in (int, float) or not low <= value <= high:
            raise ValueError(f"speculative_config.{name} must be a number in [{low}, {high}], got {value!r}.")
    if (spec.method in DRAFT_METHODS) != (spec.model is not None):
        raise ValueError(f"speculative_config.model names the draft of methods {DRAFT_METHODS}, and only of "
                         f"them (method {spec.method!r}, model {spec.model!r}).")
    if spec.model is not None:
        _verify_draft_model(config)
    if not 1 <= spec.prompt_lookup_min <= spec.prompt_lookup_max:
        raise ValueError(f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                         f"{spec.prompt_lookup_min} and {spec.prompt_lookup_max}.")
    for name, refused in (("async_scheduling=True", config.scheduler.async_scheduling),
                          ("pipeline_parallel_size > 1", config.parallel.pipeline_parallel_size > 1),
                          ("distributed_executor_backend 'mp'/'ray' or nnodes > 1",
                           config.parallel.is_multiprocess),
                          ("runner='pooling'", config.model.runner == "pooling")):
        if refused:
            raise ValueError(f"speculative_config does not combine with {name} yet.")


def resolve_draft_model(spec: SpeculativeConfig | None, revision: str | None, download_dir: str | None):
    """The config with its draft model resolved to a local path, as the target's is; a
    directory with a config.json is taken as it is (`jaxvllm compile` needs no weights; the
    worker's loader names what is missing)."""
    if spec is None or spec.model is None:
        return spec
    from jaxvllm.transformers_utils.model_path import resolve_model
    path = os.path.abspath(os.path.expanduser(spec.model))
    if not os.path.isfile(os.path.join(path, "config.json")):
        path = resolve_model(spec.model, revision, download_dir)
    return dataclasses.replace(spec, model=path)


def _verify_draft_model(config) -> None:
    from jaxvllm.models.registry import get_model_class, is_draft_model
    from jaxvllm.transformers_utils.config import load_hf_config
    draft, target = load_hf_config(config.speculative.model), config.model.hf_config
    get_model_class(draft)  # an architecture the engine loads, or its error
    if is_draft_model(draft) != (config.speculative.method == "eagle3"):
        raise ValueError(f"speculative_config.model is {'an' if is_draft_model(draft) else 'no'} EAGLE-3 head "
                         f"({draft.architectures}): method 'eagle3' takes one, 'draft_model' a whole model.")
    if getattr(draft, "quantization_config", None):
        raise ValueError("speculative_config.model is a quantized checkpoint; draft models load unquantized here.")
    positions, max_len = getattr(draft, "max_position_embeddings", None), config.scheduler.max_model_len
    if positions is not None and positions < max_len:
        raise ValueError(f"speculative_config.model holds {positions} positions, fewer than max_model_len={max_len}; "
                         "lower max_model_len.")
    if is_draft_model(draft):
        from jaxvllm.models.eagle3 import Eagle3Args
        head, layers = Eagle3Args.from_hf_config(draft), target.num_hidden_layers
        if head.target_hidden_size != target.hidden_size:
            raise ValueError(f"speculative_config.model is an EAGLE-3 head for a hidden size of "
                             f"{head.target_hidden_size}, the target's is {target.hidden_size}.")
        ids = head.aux_layers(layers)
        if len(ids) != 3 or not all(0 <= i <= layers for i in ids):
            raise ValueError(f"speculative_config.model's eagle_aux_hidden_state_layer_ids must be 3 layers in "
                             f"[0, {layers}] of the target, got {list(ids)}.")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"speculative_config.model has a vocabulary of {draft.vocab_size} tokens, the target "
                         f"{target.vocab_size}: a draft model must share the target's tokenizer.")
