"""Model shapes the benchmarks build with zero or abstract weights (no download): the default
model, Llama-3-8B (the accelerator benchmark's) and a tiny one for smoke runs; they live in
jaxvllm/models/shapes.py, where `python -m jaxvllm.memory_plan` reads them too."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm.models.llama import LlamaArgs  # noqa: E402
from jaxvllm.models.shapes import LLAMA3_8B, SHAPES, SMOLLM2, TINY  # noqa: E402

# What the end-to-end benchmarks can build with random weights (benchmarks/random_weights.py
# writes a Llama checkpoint): the Llama-family shapes above, and TINY for a CPU.
RANDOM_SHAPES = {**{k: a for k, a in SHAPES.items() if type(a) is LlamaArgs}, "tiny": TINY}
__all__ = ["LLAMA3_8B", "RANDOM_SHAPES", "SHAPES", "SMOLLM2", "TINY"]
