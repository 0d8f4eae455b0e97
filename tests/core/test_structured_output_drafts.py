"""Structured output under speculative decoding, on the scheduler's side: drafts the grammar
does not allow are cut before their step, and each verified position gets the mask of the
grammar after the drafts before it, the matcher left where it was."""
from __future__ import annotations

import numpy as np

from jaxvllm.core.request import Request
from jaxvllm.core.structured_output import StructuredOutputManager
from jaxvllm.sampling_params import SamplingParams, StructuredOutputsParams
from jaxvllm.transformers_utils.model_path import default_model_path
from jaxvllm.transformers_utils.tokenizer import load_tokenizer


def allowed(words: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(words.astype(np.int32).view(np.uint8), bitorder="little")).tolist())


def test_drafts_are_validated_and_each_position_masked_after_the_drafts_before_it():
    tokenizer = load_tokenizer(default_model_path())
    manager = StructuredOutputManager(lambda: tokenizer, len(tokenizer))
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(yes|no)!+"))
    manager.add_request(Request("r", [1, 2, 3], params, tokenizer.eos_token_id, 0))
    yes, bang = tokenizer.encode("yes!")
    assert manager.validate_drafts("r", [yes, bang, bang]) == [yes, bang, bang]
    assert manager.validate_drafts("r", [bang, yes]) == []  # "!" cannot come first
    assert manager.validate_drafts("r", [yes, yes, bang]) == [yes]
    words = manager.num_words
    rows = np.array(manager.grammar_bitmask(["r"], {"r": [yes, bang]})["r"]).reshape(-1, words)
    assert len(rows) == 3
    assert yes in allowed(rows[0]) and bang not in allowed(rows[0])
    assert bang in allowed(rows[1]) and yes not in allowed(rows[1])
    assert bang in allowed(rows[2]) and tokenizer.eos_token_id in allowed(rows[2])  # "yes!" is complete
    # The matcher is where it was: no drafts, one row, the first position's.
    assert manager.grammar_bitmask(["r"])["r"] == rows[0].tolist()
