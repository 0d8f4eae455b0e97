"""Every keyword of vLLM's current SamplingParams, StructuredOutputsParams, LLM(...),
LLM.generate and LLM.chat is honoured here (a field or parameter of the same name) or
refused with a ValueError naming it; the neutral value a vLLM script passes is accepted.

The lists are vLLM's (vllm/sampling_params.py and vllm/entrypoints/llm.py, 2026), input
fields only (not the `_`-prefixed internal ones or `output_text_buffer_length`)."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

import jaxvllm
from jaxvllm import LLM, SamplingParams, StructuredOutputsParams
from jaxvllm.config import EngineArgs
from jaxvllm.vllm_compat import (
    CHAT_REFUSED,
    GENERATE_REFUSED,
    IGNORED,
    LLM_REFUSED,
    SAMPLING_REFUSED,
    STRUCTURED_REFUSED,
)

VLLM_SAMPLING_PARAMS = [
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens",
    "logprobs", "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start",
    "logprob_token_ids", "flat_logprobs", "detokenize", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "output_kind", "stream_interval",
    "skip_clone", "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args", "bad_words",
    "skip_reading_prefix_cache", "thinking_token_budget", "repetition_detection",
    "routed_experts_prompt_start", "trace_decode_token_ids",
    "best_of", "truncate_prompt_tokens", "logits_processors",  # removed by vLLM V1, still in scripts
]
VLLM_STRUCTURED_OUTPUTS_PARAMS = [
    "json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace",
    "disable_additional_properties", "whitespace_pattern", "structural_tag", "disable_fallback"]
VLLM_LLM = [
    "model", "runner", "convert", "tokenizer", "tokenizer_mode", "skip_tokenizer_init",
    "trust_remote_code", "allowed_local_media_path", "allowed_media_domains", "tensor_parallel_size",
    "dtype", "quantization", "revision", "tokenizer_revision", "chat_template", "seed",
    "gpu_memory_utilization", "cpu_offload_gb", "offload_group_size", "offload_num_in_group",
    "offload_prefetch_step", "offload_params", "enforce_eager", "enable_return_routed_experts",
    "return_sampling_mask", "disable_custom_all_reduce", "hf_token", "hf_overrides",
    "mm_processor_kwargs", "pooler_config", "structured_outputs_config", "profiler_config",
    "attention_config", "kv_cache_memory_bytes", "compilation_config", "quantization_config",
    "logits_processors", "spec_method", "spec_model", "spec_tokens"]
VLLM_GENERATE = ["prompts", "sampling_params", "use_tqdm", "lora_request", "priority",
                 "tokenization_kwargs", "mm_processor_kwargs"]
VLLM_CHAT = ["messages", "sampling_params", "use_tqdm", "lora_request", "chat_template",
             "chat_template_content_format", "add_generation_prompt", "continue_final_message",
             "tools", "chat_template_kwargs", "tokenization_kwargs", "mm_processor_kwargs"]

# A value each refused keyword cannot take (neutral values are the table's own).
NOT_NEUTRAL = {
    "best_of": 2, "prompt_logprob_token_ids": [1], "prompt_logprob_start": 3, "logprob_token_ids": [1],
    "flat_logprobs": True, "detokenize": False, "stream_interval": 4, "skip_reading_prefix_cache": True,
    "thinking_token_budget": 64, "repetition_detection": {"max_pattern_size": 4},
    "routed_experts_prompt_start": 2, "trace_decode_token_ids": [1, 2], "logits_processors": ["p"],
    "truncate_prompt_tokens": 8, "disable_any_whitespace": True,
    "disable_additional_properties": True, "whitespace_pattern": " ", "structural_tag": "{}",
    "tokenizer": "/another/tokenizer",
    "skip_tokenizer_init": True, "allowed_local_media_path": "/data", "allowed_media_domains": ["x"],
    "tokenizer_revision": "v2", "cpu_offload_gb": 4, "offload_group_size": 2,
    "offload_num_in_group": 2, "offload_prefetch_step": 2, "offload_params": {"down_proj"},
    "enable_return_routed_experts": True, "return_sampling_mask": True, "hf_token": "hf_x",
    "hf_overrides": {"a": 1}, "mm_processor_kwargs": {"a": 1},
    "structured_outputs_config": {"backend": "xgrammar"}, "profiler_config": {"profiler": "torch"},
    "attention_config": {"backend": "FLASH_ATTN"}, "quantization_config": {"a": 1},
    "spec_method": "ngram", "spec_model": "draft", "spec_tokens": 4, "enable_lora": True,
    "lora_request": object(), "tokenization_kwargs": {"truncation": True},
    "chat_template_content_format": "openai",
}


def _accepted_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def test_every_sampling_keyword_is_honoured_or_refused():
    fields = _accepted_fields(SamplingParams)
    assert all(k in fields or k in SAMPLING_REFUSED for k in VLLM_SAMPLING_PARAMS)
    assert set(SAMPLING_REFUSED) <= set(VLLM_SAMPLING_PARAMS)
    fields = _accepted_fields(StructuredOutputsParams)
    assert all(k in fields or k in STRUCTURED_REFUSED for k in VLLM_STRUCTURED_OUTPUTS_PARAMS)


@pytest.mark.parametrize("name", [k for k in SAMPLING_REFUSED if SAMPLING_REFUSED[k][1]])
def test_a_refused_sampling_keyword_names_itself(name):
    neutral = SAMPLING_REFUSED[name][0]
    for value in (None, *neutral):
        SamplingParams(**{name: value})  # what a vLLM script passes by default runs
    with pytest.raises(ValueError, match=rf"^{name}=.* is not supported by jaxvllm's SamplingParams: \w"):
        SamplingParams(**{name: NOT_NEUTRAL[name]})


@pytest.mark.parametrize("name", [k for k in STRUCTURED_REFUSED if STRUCTURED_REFUSED[k][1]])
def test_a_refused_structured_outputs_keyword_names_itself(name):
    StructuredOutputsParams(choice=["a"], **{name: None})
    with pytest.raises(ValueError, match=rf"^{name}=.* is not supported"):
        StructuredOutputsParams(choice=["a"], **{name: NOT_NEUTRAL[name]})


def test_legacy_guided_decoding_maps_onto_structured_outputs():
    params = SamplingParams(guided_decoding={"choice": ["yes", "no"], "backend": "xgrammar"})
    assert params.structured_outputs == StructuredOutputsParams(choice=["yes", "no"])
    with pytest.raises(ValueError, match="guided_decoding and structured_outputs"):
        SamplingParams(guided_decoding={"regex": "a"}, structured_outputs=StructuredOutputsParams(regex="b"))


def test_every_llm_keyword_is_honoured_or_refused():
    own = set(inspect.signature(LLM.__init__).parameters) | _accepted_fields(EngineArgs)
    honoured = own | {"chat_template"} | set(IGNORED)
    assert all(k in honoured or k in LLM_REFUSED for k in VLLM_LLM)


@pytest.mark.parametrize("name", [k for k in LLM_REFUSED])
def test_a_refused_llm_keyword_is_named_before_anything_loads(name):
    with pytest.raises(ValueError, match=rf"^{name}=.* is not supported by jaxvllm's engine: \w"):
        LLM("/no/such/model", **{name: NOT_NEUTRAL[name]})


@pytest.mark.parametrize("method,vllm_names,table", [
    ("generate", VLLM_GENERATE, GENERATE_REFUSED), ("chat", VLLM_CHAT, CHAT_REFUSED)])
def test_generate_and_chat_take_every_vllm_keyword(method, vllm_names, table):
    params = inspect.signature(getattr(LLM, method)).parameters
    assert all(k in params for k in vllm_names)
    llm = object.__new__(LLM)  # the keywords are checked before the engine is touched
    first = [[{"role": "user", "content": "a"}]] if method == "chat" else ["a"]
    for name in table:
        with pytest.raises(ValueError, match=rf"^{name}=.* is not supported by jaxvllm's LLM\.{method}"):
            getattr(llm, method)(*first, **{name: NOT_NEUTRAL[name]})


def test_the_top_level_exports_match_vllm():
    for name in ("LLM", "SamplingParams", "StructuredOutputsParams", "BeamSearchParams",
                 "RequestOutput", "CompletionOutput", "TextPrompt", "TokensPrompt", "EngineArgs",
                 "PoolingParams", "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput",
                 "EmbeddingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput",
                 "ScoringOutput", "ScoringRequestOutput"):
        assert getattr(jaxvllm, name) is not None and name in jaxvllm.__all__


def test_chat_honours_vllm_keywords(tiny_model_dir):
    """chat_template (LLM's and chat's), tools, continue_final_message and a tqdm class, on a
    tiny model whose vocabulary is single characters (so the prompts are digits)."""
    llm = LLM(str(tiny_model_dir), tokenizer=str(tiny_model_dir), enforce_eager=True,
              chat_template="{% for m in messages %}{{ m.content }}{% endfor %}!", max_num_seqs=2,
              max_model_len=64, num_gpu_blocks_override=16, skip_warmup=True)
    params = SamplingParams(max_tokens=1)
    conv = [{"role": "user", "content": "12"}]
    assert llm.chat(conv, params, use_tqdm=False)[0].prompt == "12!"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    out = llm.chat(conv, params, use_tqdm=False, tools=tools,
                   chat_template="{{ messages[0].content }}{{ tools | length }}")
    assert out[0].prompt == "121"
    out = llm.chat(conv, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True,
                   chat_template="{% for m in messages %}<{{ m.content }}>{% endfor %}")
    assert out[0].prompt == "<12"
    bars = []

    class Bar:  # vLLM lets use_tqdm be a tqdm-like class
        def __init__(self, **kwargs):
            bars.append(kwargs["total"])
            self.format_dict = {"elapsed": 1.0}

        def set_postfix_str(self, *args, **kwargs):
            pass

        def update(self, n):
            bars.append(n)

        def close(self):
            pass

    llm.generate([[33], [34]], params, use_tqdm=Bar)
    assert bars == [2, 1, 1]
