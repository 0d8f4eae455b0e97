"""Each token's bytes, for tokenizers whose decode is the UTF-8 decoding of their tokens'
bytes laid end to end (byte-level BPE: GPT-2, Llama 3, Qwen, SmolLM).

Such a decode can run incrementally at the cost of a table lookup and one call to an
incremental UTF-8 decoder per step (detokenizer.py), instead of re-decoding a window of
recent tokens through the tokenizer. `token_bytes` builds the table only for decoders it
reproduces exactly (a lone `ByteLevel` decoder); for any other tokenizer it returns None and
the caller keeps `tokenizers`' own DecodeStream.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's map from the printable character standing for each byte back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class TokenBytes:
    """bytes_of[id]: the token's bytes (b"" for ids the tokenizer does not know);
    skipping[id]: the same with special tokens as b"" (skip_special_tokens=True)."""
    bytes_of: list[bytes]
    skipping: list[bytes]


def _is_byte_level(decoder: dict | None) -> bool:
    if decoder is None:
        return False
    if decoder.get("type") == "Sequence":
        return [d.get("type") for d in decoder.get("decoders", [])] == ["ByteLevel"]
    return decoder.get("type") == "ByteLevel"


@lru_cache(maxsize=8)
def token_bytes(tokenizer) -> TokenBytes | None:
    """The table of a transformers fast tokenizer or a `tokenizers.Tokenizer`, or None
    where its decode is not a byte-level one."""
    backend = getattr(tokenizer, "_tokenizer", tokenizer)
    if not _is_byte_level(json.loads(backend.to_str()).get("decoder")):
        return None
    alphabet = _byte_level_alphabet()
    bytes_of = []
    for token_id in range(max(backend.get_vocab(with_added_tokens=True).values()) + 1):
        token = backend.id_to_token(token_id)
        if token is None:
            bytes_of.append(b"")
        elif all(c in alphabet for c in token):
            bytes_of.append(bytes(alphabet[c] for c in token))
        else:  # as the ByteLevel decoder does: a token outside the alphabet is its own text
            bytes_of.append(token.encode())
    skipping = list(bytes_of)
    for token_id, added in backend.get_added_tokens_decoder().items():
        if added.special:
            skipping[token_id] = b""
    return TokenBytes(bytes_of, skipping)
