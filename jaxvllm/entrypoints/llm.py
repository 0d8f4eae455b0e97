"""LLM: offline batch generation, the class a vLLM user reaches for first."""
from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Callable, Sequence

from tqdm.auto import tqdm

from jaxvllm.beam_search import BeamSearchOutput, beam_search
from jaxvllm.config import EngineArgs
from jaxvllm.engine.llm_engine import LLMEngine
from jaxvllm.entrypoints.llm_pooling import LLMPooling
from jaxvllm.outputs import RequestOutput
from jaxvllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from jaxvllm.vllm_compat import CHAT_REFUSED, GENERATE_REFUSED, LLM_REFUSED, pop_vllm_args, refuse


class LLM(LLMPooling):
    """`LLM(model=None, **engine_args)`: with no model, the default SmolLM2-135M-Instruct.
    With runner="pooling" it embeds, classifies and scores instead (entrypoints/llm_pooling.py).

    Engine arguments carry vLLM's names (max_model_len, max_num_seqs,
    max_num_batched_tokens, block_size, gpu_memory_utilization, ...); vLLM's other
    keywords are accepted at their neutral values and refused otherwise (vllm_compat.py).
    `chat_template` (a file or the template itself) replaces the model's for `chat`.
    """

    def __init__(self, model: str | None = None, **kwargs):
        if kwargs.get("tokenizer") in (None, model):  # the model's own: what happens anyway
            kwargs.pop("tokenizer", None)
        self.chat_template = _load_chat_template(kwargs.pop("chat_template", None))
        kwargs = pop_vllm_args(kwargs, LLM_REFUSED)  # vLLM's arguments that mean nothing here
        config_file = kwargs.pop("config", None)
        args = (EngineArgs.from_file(config_file, model=model, **kwargs) if config_file
                else EngineArgs(model=model, **kwargs))
        self.llm_engine = LLMEngine.from_engine_args(args)
        self._counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool | Callable[..., tqdm] = True, lora_request=None,
                 priority: Sequence[int] | None = None, tokenization_kwargs: dict | None = None,
                 mm_processor_kwargs: dict | None = None) -> list[RequestOutput]:
        """prompts: a string, a list of strings, a list of token ids, a list of token-id
        lists, or vLLM-style dicts with `prompt` / `prompt_token_ids` (and `cache_salt`).
        priority: one per prompt, lower first, with scheduling_policy="priority".
        use_tqdm: a bool, or a tqdm-like class to show progress with (as in vLLM).
        lora_request: a LoRARequest for every prompt, or a list of one (or None) per prompt
        (with enable_lora=True)."""
        refuse({"tokenization_kwargs": tokenization_kwargs, "mm_processor_kwargs": mm_processor_kwargs},
               GENERATE_REFUSED, "LLM.generate")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(sampling_params)} sampling_params.")
        # generate returns finished outputs only, so none is built per step (as in vLLM).
        final = {id(p): dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                 for p in sampling_params}
        sampling_params = [final[id(p)] for p in sampling_params]
        priority = [0] * len(prompts) if priority is None else list(priority)
        if len(priority) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(priority)} priorities.")
        loras = list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(loras)} lora_requests.")
        return self._run_requests(prompts, sampling_params, use_tqdm, priority, loras)

    def _run_requests(self, prompts: list, params: list, use_tqdm, priority: list[int] | None = None,
                      loras: list | None = None) -> list:
        """Add one request per prompt and run the engine until all are finished."""
        request_ids = []
        try:
            for prompt, p, prio, lora in zip(prompts, params, priority or [0] * len(prompts),
                                             loras or [None] * len(prompts)):
                request_id = str(next(self._counter))
                self.llm_engine.add_request(request_id, prompt, p, priority=prio, lora_request=lora)
                request_ids.append(request_id)
            return self._run_engine(request_ids, use_tqdm)
        except BaseException:
            self.llm_engine.abort_request(request_ids)  # nothing of a failed call stays queued
            raise

    def beam_search(self, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """prompts: strings, token-id lists or {"prompt" / "prompt_token_ids"} dicts; each
        output holds the beam_width best sequences (prompt + generated tokens), best first."""
        return beam_search(self, [self.llm_engine.processor.tokenize(p) for p in prompts], params)

    def reset_prefix_cache(self) -> bool:
        """Forget the cached prefixes; False (and nothing done) while requests hold blocks."""
        return self.llm_engine.reset_prefix_cache()

    # ---- sleep mode and weight updates (vLLM's names; RL: generate, train, update) ----
    def sleep(self, level: int = 1) -> None:
        """Free the device for another job: level 1 moves the weights to host memory and
        frees the KV cache, level 2 frees both (update_weights, or wake_up reloading the
        checkpoint, brings weights back). Compiled programs are kept, the prefix cache is
        reset; refused while requests are in flight, and generate raises while asleep."""
        self.llm_engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore the weights and the KV cache, or only those `tags` names ("weights",
        "kv_cache")."""
        self.llm_engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.llm_engine.is_sleeping()

    def update_weights(self, weights) -> None:
        """Replace weights between generate calls: {name: numpy or jax array}, named as the
        checkpoint names them ('model.layers.0.mlp.up_proj.weight') or as the engine's
        parameter tree ('layers.0.gate_up_proj'; jax arrays of its dtype and sharding are
        used without a copy), or a path (a safetensors directory, an Orbax checkpoint). All
        are checked before any weight changes; the prefix cache is reset. Asleep, the weights
        wake with the update (the KV cache with wake_up)."""
        self.llm_engine.update_weights(weights)

    def start_profile(self, profile_dir: str | None = None) -> str:
        """Start capturing a jax.profiler trace (profile_dir, else the engine's profile_dir);
        open it with TensorBoard/XProf or Perfetto. Returns the directory."""
        return self.llm_engine.start_profile(profile_dir)

    def stop_profile(self) -> None:
        self.llm_engine.stop_profile()

    def chat(self, messages, sampling_params=None, use_tqdm: bool | Callable[..., tqdm] = True,
             lora_request=None, chat_template: str | None = None,
             chat_template_content_format: str = "auto", add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None, tokenization_kwargs: dict | None = None,
             mm_processor_kwargs: dict | None = None) -> list[RequestOutput]:
        """messages: one conversation (a list of {"role", "content"} dicts) or a list of them.
        Each output's `prompt` is the conversation as the chat template rendered it
        (`chat_template`, else LLM(chat_template=...), else the model's own)."""
        refuse({"tokenization_kwargs": tokenization_kwargs, "mm_processor_kwargs": mm_processor_kwargs,
                "chat_template_content_format": chat_template_content_format},
               CHAT_REFUSED, "LLM.chat")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        template = _load_chat_template(chat_template) or self.chat_template
        if template is None and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"LLM.chat: the tokenizer of {self.llm_engine.config.model.model} has no chat template "
                             "(a GGUF file need not carry one); pass chat_template= (a Jinja template or a "
                             "file), to LLM or to chat, or --chat-template on the command line.")
        extra = dict(chat_template_kwargs or {})
        extra.update({k: v for k, v in (("chat_template", template), ("tools", tools)) if v is not None})
        prompts = []
        for conv in conversations:
            text = tokenizer.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **extra)
            prompts.append({"prompt": text,
                            "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)

    def _run_engine(self, request_ids: list[str], use_tqdm) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = (use_tqdm if callable(use_tqdm) else tqdm)(
            total=len(request_ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        in_tokens = out_tokens = 0
        while self.llm_engine.has_unfinished_requests():
            for output in self.llm_engine.step():
                if output.finished:
                    finished[output.request_id] = output
                    in_tokens += len(output.prompt_token_ids)
                    if isinstance(output, RequestOutput):  # a pooling request generates nothing
                        out_tokens += sum(len(o.token_ids) for o in output.outputs)
                    elapsed = bar.format_dict["elapsed"] or 1e-9
                    bar.set_postfix_str(f"est. speed input: {in_tokens / elapsed:.2f} toks/s, "
                                        f"output: {out_tokens / elapsed:.2f} toks/s", refresh=False)
                    bar.update(1)
        bar.close()
        return [finished[r] for r in request_ids]


def _load_chat_template(value: str | None) -> str | None:
    """A chat template given as a file's path or as the template itself (as vLLM reads it)."""
    if value is not None and os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value
