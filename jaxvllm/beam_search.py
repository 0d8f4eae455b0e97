"""Beam search, as vLLM's `LLM.beam_search` does it: in the front end, on top of logprobs.

Each step runs every live beam as a one-token request asking for its top 2 x beam_width
logprobs, then keeps the beam_width best extensions per prompt by cumulative logprob
(normalised by length ** length_penalty). The beams' shared history costs no recompute:
their full KV blocks come from the prefix cache (only the last, partly filled block of
each beam is computed again). Finished beams (EOS, unless ignore_eos) wait in `completed`.
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from jaxvllm.outputs import Logprob
from jaxvllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams


@dataclass
class BeamSearchSequence:
    """tokens holds the prompt followed by the generated tokens (vLLM's layout)."""
    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


@dataclass
class BeamSearchInstance:
    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = field(default_factory=list)


def get_beam_search_score(tokens: list[int], cumulative_logprob: float, eos_token_id: int | None,
                          length_penalty: float = 1.0) -> float:
    """vLLM's score: the EOS token does not count towards the length."""
    seq_len = len(tokens) - (1 if tokens[-1] == eos_token_id else 0)
    return cumulative_logprob / (seq_len ** length_penalty)


class BeamSearch:
    """The algorithm as a state machine, so that the synchronous LLM and the asyncio
    server drive the same code: `step_prompts()` lists the requests of the next step,
    `update(outputs)` consumes their outputs, `results()` ranks what is left."""

    def __init__(self, tokenizer, eos_token_id: int | None, prompt_token_ids: list[list[int]],
                 params: BeamSearchParams):
        self.tokenizer, self.eos, self.params = tokenizer, eos_token_id, params
        self.step_params = SamplingParams(logprobs=2 * params.beam_width, max_tokens=1,
                                          temperature=params.temperature, ignore_eos=params.ignore_eos)
        self.instances = [BeamSearchInstance([BeamSearchSequence(list(p), [])]) for p in prompt_token_ids]
        self.num_steps = 0
        self._live: list[tuple[BeamSearchInstance, BeamSearchSequence]] = []

    def score(self, beam: BeamSearchSequence) -> float:
        return get_beam_search_score(beam.tokens, beam.cum_logprob, self.eos, self.params.length_penalty)

    def step_prompts(self) -> list[dict]:
        """The next step's prompts (one per live beam); empty when the search is over."""
        if self.num_steps >= self.params.max_tokens:
            return []
        self._live = [(inst, beam) for inst in self.instances for beam in inst.beams]
        return [{"prompt_token_ids": beam.tokens} for _, beam in self._live]

    def update(self, outputs) -> None:
        """outputs: the finished RequestOutput of each step prompt, in order."""
        self.num_steps += 1
        candidates: dict[int, list[BeamSearchSequence]] = {id(inst): [] for inst in self.instances}
        for (inst, beam), out in zip(self._live, outputs):
            completion = out.outputs[0]
            if not completion.logprobs:  # ended by max_model_len: nothing to extend
                inst.completed.append(beam)
                continue
            position = completion.logprobs[0]
            for token, lp in position.items():
                new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [position],
                                         beam.cum_logprob + lp.logprob)
                if token == self.eos and not self.params.ignore_eos:
                    new.finish_reason = "stop"
                    inst.completed.append(new)
                else:
                    candidates[id(inst)].append(new)
        for inst in self.instances:
            inst.beams = sorted(candidates[id(inst)], key=self.score, reverse=True)[:self.params.beam_width]

    def results(self) -> list[BeamSearchOutput]:
        results = []
        for inst in self.instances:
            for beam in inst.beams:
                beam.finish_reason = beam.finish_reason or "length"
            best = sorted(inst.completed + inst.beams, key=self.score, reverse=True)[:self.params.beam_width]
            for beam in best:
                beam.text = self.tokenizer.decode(beam.tokens)
            results.append(BeamSearchOutput(best))
        return results


def beam_search(llm, prompt_token_ids: list[list[int]], params: BeamSearchParams) -> list[BeamSearchOutput]:
    search = BeamSearch(llm.get_tokenizer(), llm.llm_engine.processor.eos_token_id, prompt_token_ids,
                        params)
    while prompts := search.step_prompts():
        search.update(llm.generate(prompts, search.step_params, use_tqdm=False))
    return search.results()


async def beam_search_async(engine, prompt_token_ids: list[int], params: BeamSearchParams,
                            request_id: str) -> BeamSearchOutput:
    """The same search driven through AsyncLLM: each step's beams run concurrently."""
    search = BeamSearch(engine.get_tokenizer(), engine.processor.eos_token_id, [prompt_token_ids],
                        params)
    step_params = dataclasses.replace(search.step_params, output_kind=RequestOutputKind.FINAL_ONLY)

    async def final(prompt, rid):
        return [out async for out in engine.generate(prompt, step_params, rid)][-1]

    while prompts := search.step_prompts():
        search.update(await asyncio.gather(*(
            final(p, f"{request_id}-beam{search.num_steps}-{i}") for i, p in enumerate(prompts))))
    return search.results()[0]
