"""The pooler (vLLM's `layers/pooler.py`): what a pooling request keeps of its hidden states
while its prompt is prefilled, chunk by chunk, and what it returns at the end.

The device reduces each step's hidden states per request (worker/pooling_runner.py: the last
token's row, the first's, their sum); here, on the host, a request accumulates them across
its chunks in float32 (MEAN sums, CLS keeps the first chunk's first row, LAST the final
chunk's last, ALL every row) and, once its prompt is done, its pooled hidden state becomes
an embedding (Matryoshka-truncated to `dimensions`, then L2-normalized) or, through the
model's score head, class probabilities (softmax; sigmoid for a single label).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jaxvllm.pooling_params import PoolingParams


@dataclass
class PoolingState:
    """One request's pooling so far."""
    params: PoolingParams
    last: np.ndarray | None = None  # LAST: the latest chunk's last row
    total: np.ndarray | None = None  # MEAN: the sum of the rows computed so far
    count: int = 0
    first: np.ndarray | None = None  # CLS
    rows: list[np.ndarray] = field(default_factory=list)  # ALL

    def add_chunk(self, start: int, count: int, last: np.ndarray, total: np.ndarray | None,
                  first: np.ndarray | None, rows: np.ndarray | None) -> None:
        """A step computed positions [start, start + count) of the prompt: `last` is the row
        of its last position, `total` the sum of its rows, `first` its first row, `rows` all
        of them (each given when this request's pooling type reads it)."""
        kind = self.params.pooling_type
        if kind == "MEAN":
            self.total = total.astype(np.float32) if self.total is None else self.total + total
            self.count += count
        elif kind == "CLS" and start == 0:
            self.first = first.astype(np.float32)
        elif kind == "ALL":
            self.rows.append(rows.astype(np.float32))
        self.last = last.astype(np.float32)

    def pooled(self) -> np.ndarray:
        """The pooled hidden state [hidden] (ALL: [tokens, hidden])."""
        kind = self.params.pooling_type
        if kind == "MEAN":
            return self.total / self.count
        if kind == "CLS":
            return self.first
        if kind == "ALL":
            return np.concatenate(self.rows)
        return self.last


def embedding(pooled: np.ndarray, params: PoolingParams) -> np.ndarray:
    if params.dimensions is not None:
        pooled = pooled[..., :params.dimensions]
    if params.normalize:
        norm = np.linalg.norm(pooled, axis=-1, keepdims=True)
        pooled = pooled / np.maximum(norm, 1e-12)  # torch.nn.functional.normalize's eps
    return pooled


def classification(logits: np.ndarray, params: PoolingParams) -> np.ndarray:
    """A score head's logits as vLLM's classifier returns them: probabilities unless
    use_activation is off."""
    if not params.use_activation:
        return logits
    if logits.shape[-1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
