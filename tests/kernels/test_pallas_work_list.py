"""common.work_list: the static grid's map onto a ragged batch, checked against a plain
enumeration of (token block, sequence) pairs."""
from __future__ import annotations

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels.common import work_list

_work_list = jax.jit(work_list, static_argnums=(2, 3))
SLOTS, NUM_TOKENS = 6, 40  # fixed shapes: one compile per block_q


@settings(max_examples=40, derandomize=True, deadline=None)
@given(q_lens=st.lists(st.integers(0, 6), min_size=0, max_size=SLOTS), block_q=st.sampled_from([1, 4, 8]))
def test_work_list_covers_every_block_once_in_order(q_lens, block_q):
    total = sum(q_lens)
    cu = np.full(SLOTS + 1, total, np.int32)
    cu[0] = 0
    cu[1:len(q_lens) + 1] = np.cumsum(q_lens)
    block, seq, first = map(np.asarray, _work_list(cu, np.array([len(q_lens)], np.int32), NUM_TOKENS, block_q))
    num_blocks = -(-NUM_TOKENS // block_q)
    assert len(block) == num_blocks + SLOTS

    want = []
    for b in range(num_blocks):
        owners = [s for s, n in enumerate(q_lens) if n and cu[s] < (b + 1) * block_q and cu[s + 1] > b * block_q]
        want += [(b, s) for s in owners] or [(b, -1)]
    n = len(want)
    assert list(zip(block[:n].tolist(), seq[:n].tolist())) == want
    # The tail is no-ops on the last block, so it stays resident and untouched.
    assert (block[n:] == num_blocks - 1).all() and (seq[n:] == -1).all() and not first[n:].any()
    assert first[:n].tolist() == [i == 0 or want[i][0] != want[i - 1][0] for i in range(n)]
