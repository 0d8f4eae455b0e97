"""Incremental detokenization and stop-string checking for one request (vLLM V1 semantics).

Decoding the whole output again after every step costs O(n^2) over a request, and decoding
each token on its own breaks characters whose UTF-8 bytes span several tokens (emoji, CJK).
Two sources of text solve both, each giving pieces whose concatenation is
`tokenizer.decode(output_ids)`:
- byte-level BPE tokenizers (the default model's): each token's bytes from a table built
  once (token_bytes.py) into an incremental UTF-8 decoder, which holds back an incomplete
  character; a step is a lookup and one decoder call;
- any other tokenizer: `tokenizers.decoders.DecodeStream`, which re-decodes a short window of
  recent ids and yields text once it forms complete characters.
"""
from __future__ import annotations

from codecs import utf_8_decode

from tokenizers.decoders import DecodeStream

from jaxvllm.sampling_params import SamplingParams
from jaxvllm.transformers_utils.token_bytes import token_bytes

# Prompt tokens used to prime the stream: enough context for decoders whose output depends
# on the previous token (e.g. leading-space rules), few enough to stay cheap.
_MIN_PRIME_TOKENS = 4
_MAX_PRIME_TOKENS = 24
_INVALID_PREFIX = "Invalid prefix encountered"  # tokenizers' DecodeStreamError


class TokenBytesStream:
    """Text of a byte-level tokenizer's tokens: their bytes, decoded as UTF-8 up to the
    last complete character (the rest waits for the next step, as codecs' incremental
    decoder does). Byte-level decoding needs no context, so the prompt plays no part."""

    def __init__(self, table: list[bytes]):
        self._table = table
        self._pending = b""  # the first bytes of an incomplete last character

    def step(self, token_ids: list[int]) -> str:
        table = self._table
        try:
            data = self._pending + b"".join([table[t] for t in token_ids])
        except IndexError:  # an id past the tokenizer's vocabulary: decode skips it too
            data = self._pending + b"".join([table[t] if t < len(table) else b"" for t in token_ids])
        text, consumed = utf_8_decode(data, "replace", False)
        self._pending = data[consumed:]
        return text

    def flush(self) -> str:
        """An incomplete last character, as decode renders it (U+FFFD)."""
        text, self._pending = utf_8_decode(self._pending, "replace", True)[0], b""
        return text


class TokenizerStream:
    """Text of any tokenizer's tokens through `tokenizers`' DecodeStream, primed with the
    prompt's tail."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool):
        self._tokenizer, self._skip_special_tokens = tokenizer, skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._prime(prompt_token_ids)

    def _prime(self, prompt_token_ids: list[int]) -> None:
        """Feed the stream the prompt's tail, so the first output token decodes in context.

        The tail must decode cleanly (no U+FFFD): a character cut at either end would make
        the stream's text prefix differ from what follows, and it would then emit the whole
        tail again. As in vLLM, take the shortest clean tail of at least _MIN_PRIME_TOKENS
        tokens (or the whole prompt if shorter). A prompt that ends mid-character has none;
        the stream then starts empty and the output decodes on its own.
        """
        total = len(prompt_token_ids)
        for n in range(min(_MIN_PRIME_TOKENS, total), min(total, _MAX_PRIME_TOKENS) + 1):
            tail = list(prompt_token_ids[total - n:])
            if "\ufffd" not in self._tokenizer.decode(tail, skip_special_tokens=False):
                if tail:
                    self._stream.step(self._tokenizer, tail)
                return

    def step(self, token_ids: list[int]) -> str:
        try:
            return self._stream.step(self._tokenizer, list(token_ids)) or ""
        except Exception as e:
            # A decoder whose text is not monotonic in its tokens (seen with Gemma 3's
            # byte-fallback tokens) breaks the stream's state; as vLLM does, start a new
            # stream from these tokens rather than fail the request.
            if not str(e).startswith(_INVALID_PREFIX):
                raise
            self._stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
            return self._stream.step(self._tokenizer, list(token_ids)) or ""

    def flush(self) -> str:
        return ""  # the stream yields no incomplete character


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text and finds its stop strings."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        table = token_bytes(tokenizer)
        if table is not None:
            self._source = TokenBytesStream(table.skipping if params.skip_special_tokens else table.bytes_of)
        else:  # a transformers fast tokenizer wraps a `tokenizers.Tokenizer`; accept either
            self._source = TokenizerStream(getattr(tokenizer, "_tokenizer", tokenizer), prompt_token_ids,
                                           params.skip_special_tokens)
        self.stop: list[str] = params.stop
        self.include_stop_str_in_output = params.include_stop_str_in_output
        # A stop string may still be completing at the end of the text; when it is to be cut
        # from the output, streaming holds back the characters that could be its beginning.
        if self.stop and not self.include_stop_str_in_output:
            self.stop_buffer_length = max(len(s) for s in self.stop) - 1
        else:
            self.stop_buffer_length = 0
        self._text = ""
        # With no stop string to look for, a byte-level stream's text is decoded when it is
        # read, not at every step: a request read once (FINAL_ONLY) costs an append a step.
        self._deferred: list[int] | None = [] if table is not None and not self.stop else None
        self._finished = False
        self._last_output_text_offset = 0

    @property
    def output_text(self) -> str:
        if self._deferred:
            self._text += self._source.step(self._deferred)
            self._deferred.clear()
        return self._text

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append newly generated tokens; return the stop string that matched, else None.

        On a match the text is truncated before the stop string (after it with
        include_stop_str_in_output) and the caller finishes the request with
        finish_reason "stop" and stop_reason set to the returned string.

        stop_terminated=True means the engine finished the request on EOS or a stop token id
        with the last of new_token_ids. As in vLLM, that token's text is left out unless
        include_stop_str_in_output, and stop strings are not checked.
        """
        if stop_terminated:
            if not self.include_stop_str_in_output:
                new_token_ids = new_token_ids[:-1]
            text = self.output_text
            if new_token_ids:
                text += self._source.step(new_token_ids)
            self._text = text + self._source.flush()
            self._finished = True
            return None
        if not new_token_ids:
            return None
        if self._deferred is not None:
            self._deferred += new_token_ids
            return None
        offset_before = len(self._text)
        self._text += self._source.step(new_token_ids)
        if not self.stop:
            return None
        match = self._find_stop(offset_before)
        if match is None:
            return None
        stop_str, start = match
        end = start + len(stop_str) if self.include_stop_str_in_output else start
        self._text = self._text[:end]
        self._finished = True
        return stop_str

    def _find_stop(self, offset_before: int) -> tuple[str, int] | None:
        """Earliest stop string that ends in the new text: (string, start index), or None.

        Only the new text and the len(stop) - 1 characters before it can hold a match that
        was not already found at an earlier step, so only that window is searched.
        """
        best = None
        for stop_str in self.stop:
            start = self._text.find(stop_str, max(0, offset_before - len(stop_str) + 1))
            if start != -1 and (best is None or start < best[1]):
                best = (stop_str, start)
        return best

    def get_next_output_text(self, delta: bool, finished: bool = False) -> str:
        """The whole text, or with delta=True only what is new since the last call.

        While the request runs, the last stop_buffer_length characters are held back: they
        may be the start of a stop string that must not reach the client. They are released
        once the request has finished: on its own after a stop string or stop_terminated, or
        when the caller passes finished=True (length limit, abort), which also ends an
        incomplete last character.
        """
        text = self.output_text
        if finished and not self._finished:
            text = self._text = text + self._source.flush()
            self._finished = True
        hold = 0 if self._finished else self.stop_buffer_length
        end = max(len(text) - hold, 0)
        if not delta:
            return text[:end]
        start = self._last_output_text_offset
        if end <= start:
            return ""
        self._last_output_text_offset = end
        return text[start:end]
