"""vLLM keywords that have no meaning here, so that scripts and command lines written for
vLLM run unchanged or stop with a reason, never silently differ.

IGNORED engine arguments are accepted with one warning each (saying why). Every REFUSED
keyword (of `LLM(...)`, `SamplingParams`, `StructuredOutputsParams`, `LLM.generate` and
`LLM.chat`) is accepted only at a neutral value (what vLLM does by default) and otherwise
raises a ValueError that names it and says what is missing. Every other keyword of vLLM's
current signatures is honoured under the same name (tests/test_vllm_keywords.py checks
the lists against vLLM's).
"""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

IGNORED = {
    "enforce_eager": "XLA compiles every step; there is no eager mode or CUDA graph to turn off",
    "trust_remote_code": "jaxvllm runs its own model code only, never a checkpoint's",
    "disable_log_stats": "jaxvllm logs no periodic stats; /metrics serves them",
    "disable_log_requests": "jaxvllm does not log requests",
    "tokenizer_mode": "the Hugging Face fast tokenizer is always used",
    "max_seq_len_to_capture": "there are no CUDA graphs; shapes are bucketed instead",
    "disable_custom_all_reduce": "XLA chooses the collectives",
    "compilation_config": "XLA compiles the whole step; its flags are the platform's",
}
_NO_MM = "multimodal inputs are not supported"
_NO_OFFLOAD = "weights cannot be offloaded to host memory"
_NO_SPEC = "use speculative_config={'method': 'ngram', 'num_speculative_tokens': k}"
# name: (neutral values, what to say when another value is given)
REFUSED = {  # LLM(...) and engine arguments (also the CLI's flags of the same names)
    "cpu_offload_gb": ((0,), _NO_OFFLOAD),
}
LLM_REFUSED = REFUSED | {
    "tokenizer": ((), "the tokenizer is always the model's own (omit tokenizer)"),
    "skip_tokenizer_init": ((False,), "prompts are always tokenized and outputs detokenized"),
    "allowed_local_media_path": (("",), _NO_MM),
    "allowed_media_domains": ((), _NO_MM),
    "tokenizer_revision": ((), "the tokenizer is read with the model at its revision"),
    "offload_group_size": ((0,), _NO_OFFLOAD),
    "offload_num_in_group": ((1,), _NO_OFFLOAD),
    "offload_prefetch_step": ((1,), _NO_OFFLOAD),
    "offload_params": ((set(), frozenset()), _NO_OFFLOAD),
    "enable_return_routed_experts": ((False,), "MoE routing is not returned"),
    "return_sampling_mask": ((False,), "sampling masks are not returned"),
    "hf_token": ((True,), "set HF_TOKEN in the environment (huggingface_hub reads it)"),
    "hf_overrides": (({},), "the checkpoint's config is used as it is"),
    "mm_processor_kwargs": (({},), _NO_MM),
    "structured_outputs_config": (({},), "structured outputs always use llguidance"),
    "profiler_config": (({},), "use profile_dir= (jax.profiler traces)"),
    "attention_config": (({},), "use attention_backend="),
    "quantization_config": (({},), "use quantization="),
    "logits_processors": (([],), "custom logits processors are not supported"),
    "spec_method": ((), _NO_SPEC),
    "spec_model": ((), _NO_SPEC),
    "spec_tokens": ((), _NO_SPEC),
}
SAMPLING_REFUSED = {
    "best_of": ((1,), "vLLM V1 removed it; ask for n samples and keep the best cumulative_logprob"),
    "prompt_logprob_token_ids": ((), "use prompt_logprobs"),
    "prompt_logprob_start": ((0,), "prompt logprobs start at the first prompt token"),
    "logprob_token_ids": ((), "use logprobs (the top-k tokens)"),
    "flat_logprobs": ((False,), "logprobs come as one dict per position"),
    "detokenize": ((True,), "outputs are always detokenized"),
    "stream_interval": ((1,), "every new token is streamed"),
    "skip_clone": ((False, True), ""),  # no clone happens here: both values mean the same
    "skip_reading_prefix_cache": ((False,), "every request reads the prefix cache"),
    "thinking_token_budget": ((-1,), "a thinking budget is not supported yet"),
    "repetition_detection": ((), "repetition detection is not supported"),
    "routed_experts_prompt_start": ((0,), "MoE routing is not returned"),
    "trace_decode_token_ids": ((), "forced decoding is not supported"),
    "logits_processors": (([],), "custom logits processors are not supported"),
    "truncate_prompt_tokens": ((), "prompt truncation is not supported yet; shorten the prompt"),
}
STRUCTURED_REFUSED = {
    "disable_any_whitespace": ((False,), "JSON grammars allow up to 20 whitespace characters between "
                                         "tokens, tool calls none"),
    # Both values close objects that declare properties, as vLLM's default backend does.
    "disable_additional_properties": ((False, True), ""),
    "whitespace_pattern": ((), "JSON grammars allow up to 20 whitespace characters between tokens"),
    "structural_tag": ((), "structural tags are not supported"),
    "disable_fallback": ((False, True), ""),  # one backend: there is nothing to fall back to
}
POOLING_REFUSED = {  # LLM.encode / embed / classify / score
    "lora_request": ((), "pooling models serve no LoRA adapters"),
    "tokenization_kwargs": (({},), "prompts are tokenized with the tokenizer's defaults"),
}
GENERATE_REFUSED = {
    "tokenization_kwargs": (({},), "prompts are tokenized with the tokenizer's defaults"),
    "mm_processor_kwargs": (({},), _NO_MM),
}
CHAT_REFUSED = GENERATE_REFUSED | {
    "chat_template_content_format": (("auto", "string"),
                                     "message content is passed to the template as a string"),
}


_warned: set[str] = set()


def warn_legacy_once(name: str, replacement: str) -> None:
    """One warning per legacy field name for the process's life (a bounded set)."""
    if name not in _warned:
        _warned.add(name)
        logger.warning("%s is deprecated in vLLM and removed in its current API; jaxvllm maps it "
                       "onto %s (this warning is shown once).", name, replacement)


def refuse(kwargs: dict, table: dict, where: str) -> dict:
    """kwargs without the table's names; ValueError naming the first one set to something
    other than None or a neutral value."""
    for name in [k for k in kwargs if k in table]:
        value = kwargs.pop(name)
        neutral, why = table[name]
        if value is not None and not any(value == v and isinstance(value, bool) == isinstance(v, bool)
                                         for v in neutral):
            raise ValueError(f"{name}={value!r} is not supported by jaxvllm's {where}: {why}.")
    return kwargs


def pop_vllm_args(kwargs: dict, table: dict = REFUSED) -> dict:
    """kwargs without the IGNORED and REFUSED names (warning, or ValueError, as due)."""
    for name, why in IGNORED.items():
        if name in kwargs:
            value = kwargs.pop(name)
            logger.warning("Ignoring vLLM's %s=%r: %s.", name, value, why)
    return refuse(kwargs, table, "engine")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's flags for the engine names above, grouped in --help as accepted for compatibility."""
    group = parser.add_argument_group("vLLM arguments accepted for compatibility")
    for name, why in IGNORED.items():
        flag = "--" + name.replace("_", "-")
        if name in ("enforce_eager", "trust_remote_code", "disable_log_stats", "disable_log_requests",
                    "disable_custom_all_reduce"):
            group.add_argument(flag, action="store_true", default=None, help=f"Ignored: {why}.")
        else:
            group.add_argument(flag, default=None, help=f"Ignored: {why}.")
    for name, (neutral, why) in REFUSED.items():
        flag = "--" + name.replace("_", "-")
        kind = {bool: None, int: int}.get(type(neutral[0]), str)
        if kind is None:
            group.add_argument(flag, action="store_true", default=None, help=f"Only {neutral[0]}: {why}.")
        else:
            group.add_argument(flag, type=kind, default=None, help=f"Only {neutral[0]}: {why}.")


def check_cli_args(ns: argparse.Namespace) -> None:
    """Warn about (or refuse) the vLLM flags given on a command line."""
    pop_vllm_args({name: getattr(ns, name) for name in (*IGNORED, *REFUSED)
                   if getattr(ns, name, None) is not None})
