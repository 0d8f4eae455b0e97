"""A seeded synthetic workload shared by the benchmarks, identical for every engine.

Prompts are windows of real English text, so the tokenizer sees words rather than random
ids: the documentation of Python's standard library, which every machine has (no data
set to download). Each request gets a prompt length and an output length drawn from the
given ranges; outputs run to their length (ignore_eos), so every engine does the same work.
"""
from __future__ import annotations

import importlib
import inspect
import random
from dataclasses import asdict, dataclass

_CORPUS_MODULES = ("argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email",
                   "functools", "http.server", "inspect", "itertools", "json", "logging",
                   "pathlib", "shutil", "subprocess", "textwrap", "threading", "unittest", "zipfile")


@dataclass
class Workload:
    prompts: list[list[int]]     # token ids
    output_lens: list[int]
    seed: int
    input_len_range: tuple[int, int]
    output_len_range: tuple[int, int]

    @property
    def num_input_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def describe(self) -> dict:
        d = asdict(self)
        del d["prompts"], d["output_lens"]
        d.update(num_requests=len(self.prompts), num_input_tokens=self.num_input_tokens,
                 num_output_tokens=self.num_output_tokens)
        return d


def corpus_text() -> str:
    """Module and member docstrings of a fixed list of stdlib modules (~100k characters)."""
    parts = []
    for name in _CORPUS_MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for member_name, member in sorted(vars(module).items()):
            if not member_name.startswith("_") and (inspect.isclass(member) or inspect.isfunction(member)):
                parts.append(inspect.getdoc(member) or "")
    return "\n\n".join(p for p in parts if p)


def make_workload(tokenizer, num_requests: int = 64, input_len: tuple[int, int] = (32, 512),
                  output_len: tuple[int, int] = (16, 256), seed: int = 0) -> Workload:
    """Each prompt is a window of `corpus_text()`'s tokens at a random offset."""
    tokens = tokenizer.encode(corpus_text())
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(num_requests):
        n = rng.randint(*input_len)
        if n > len(tokens):
            raise ValueError(f"input_len {n} exceeds the corpus ({len(tokens)} tokens).")
        start = rng.randrange(len(tokens) - n + 1)
        prompts.append(tokens[start:start + n])
        outs.append(rng.randint(*output_len))
    return Workload(prompts, outs, seed, tuple(input_len), tuple(output_len))


def make_random_workload(vocab_size: int, num_requests: int = 256, input_len: tuple[int, int] = (32, 512),
                         output_len: tuple[int, int] = (16, 256), seed: int = 0) -> Workload:
    """The same draw of lengths, with seeded random token ids for prompts: for random-weight
    models, whose stand-in tokenizer gives text no meaning (ids 0-2 are left out: special)."""
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(num_requests):
        n = rng.randint(*input_len)
        prompts.append([rng.randrange(3, vocab_size) for _ in range(n)])
        outs.append(rng.randint(*output_len))
    return Workload(prompts, outs, seed, tuple(input_len), tuple(output_len))
