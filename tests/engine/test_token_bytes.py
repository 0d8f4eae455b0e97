"""The token-bytes detokenizer equals `tokenizers`' own decode for any token sequence, and
tokenizers whose decode it does not reproduce keep DecodeStream.

Random ids (not only ids of real text) reach characters cut between tokens, invalid UTF-8,
special tokens and ids past the vocabulary, in chunks of any size, as a sampler produces them.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxvllm.engine.detokenizer import IncrementalDetokenizer, TokenBytesStream, TokenizerStream
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.transformers_utils.token_bytes import token_bytes


@pytest.fixture(scope="module")
def tok():
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    return load_tokenizer(default_model_path())


def stream(tok, ids: list[int], cuts: list[int], params: SamplingParams) -> tuple[str, str]:
    """(the deltas joined, the final text) of `ids` fed in chunks cut at `cuts`, finished
    by length."""
    detok = IncrementalDetokenizer(tok, tok.encode("Hello there"), params)
    deltas, start = [], 0
    for end in sorted(set(cuts)) + [len(ids)]:
        detok.update(ids[start:end], False)
        deltas.append(detok.get_next_output_text(delta=True))
        start = end
    deltas.append(detok.get_next_output_text(delta=True, finished=True))
    return "".join(deltas), detok.get_next_output_text(delta=False, finished=True)


def token_ids(vocab: int):
    """Mostly byte tokens (ids < 256 in byte-level BPE: parts of multi-byte characters),
    special tokens (0-16 in the default model), any id, and ids past the vocabulary."""
    return st.lists(st.one_of(st.integers(0, 300), st.integers(0, 16), st.integers(0, vocab - 1),
                              st.integers(vocab, vocab + 64)), max_size=24)


def test_default_tokenizer_takes_the_table(tok):
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    assert isinstance(detok._source, TokenBytesStream)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_random_ids_decode_as_the_tokenizer(tok, data, skip):
    vocab = len(tok)
    ids = data.draw(token_ids(vocab))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))
    joined, final = stream(tok, ids, cuts, SamplingParams(skip_special_tokens=skip))
    expected = tok._tokenizer.decode([i for i in ids if i < vocab], skip_special_tokens=skip)
    assert joined == final == expected


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_any_text_decodes_as_the_tokenizer(tok, text):
    ids = tok.encode(text)
    assert stream(tok, ids, [1, 2, 5], SamplingParams())[1] == tok._tokenizer.decode(ids)


@pytest.fixture(scope="module")
def sentencepiece_tok():
    """A Llama-2-style SentencePiece tokenizer (▁ for spaces, <0xNN> byte fallback), built
    from `tokenizers`' own classes: no download."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "▁the", "▁a", "he", "llo", "▁he", "o", "l", "h", "e", "t", "a", "▁w", "or", "ld"]
    model = models.BPE({p: i for i, p in enumerate(pieces)}, [], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return tokenizer


def test_sentencepiece_keeps_decode_stream(sentencepiece_tok):
    assert token_bytes(sentencepiece_tok) is None
    detok = IncrementalDetokenizer(sentencepiece_tok, [], SamplingParams())
    assert isinstance(detok._source, TokenizerStream)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet="helo wrdtaé日🦀", min_size=1, max_size=30))
def test_sentencepiece_text_decodes_as_the_tokenizer(sentencepiece_tok, text):
    tok = sentencepiece_tok
    prompt = tok.encode("hello the world").ids
    ids = tok.encode(text).ids
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams())
    pieces = []
    for i in ids:
        detok.update([i], False)
        pieces.append(detok.get_next_output_text(delta=True))
    pieces.append(detok.get_next_output_text(delta=True, finished=True))
    # In context the first token keeps its leading space; decode strips it (Strip decoder).
    assert "".join(pieces) == tok.decode(prompt + ids)[len(tok.decode(prompt)):]
