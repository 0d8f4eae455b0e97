"""Logprobs in OpenAI's two formats: legacy completions (tokens, token_logprobs,
top_logprobs, text_offset) and chat ({"content": [{token, logprob, bytes, top_logprobs}]}).

An engine entry is one position's {token_id: Logprob | float}, Logprob having `.logprob`
(and `.decoded_token` when the engine filled it in); prompt logprobs start with None.
"""
from __future__ import annotations

# OpenAI clients parse JSON, which has no -inf.
_FLOOR = -9999.0


def _value(lp) -> float:
    return max(float(getattr(lp, "logprob", lp)), _FLOOR)


def _decode(tokenizer, token_id: int, lp=None) -> str:
    decoded = getattr(lp, "decoded_token", None)
    return decoded if decoded is not None else tokenizer.decode([token_id])


def _ranked(entry: dict, num: int) -> list[tuple[int, object]]:
    return sorted(entry.items(), key=lambda kv: -_value(kv[1]))[:num]


def completion_logprobs(tokenizer, token_ids: list[int], entries: list, num: int,
                        text_offset: int = 0) -> dict:
    """Legacy format for `token_ids`; `entries[i]` None (the first prompt token) -> nulls."""
    out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for token_id, entry in zip(token_ids, entries):
        own = entry.get(token_id) if entry else None
        token = _decode(tokenizer, token_id, own)
        out["tokens"].append(token)
        out["text_offset"].append(text_offset)
        text_offset += len(token)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(_value(own) if own is not None else None)
        top = {_decode(tokenizer, t, lp): _value(lp) for t, lp in _ranked(entry, num)}
        if own is not None:
            top.setdefault(token, _value(own))
        out["top_logprobs"].append(top)
    return out


def chat_logprobs(tokenizer, token_ids: list[int], entries: list, num: int) -> dict:
    content = []
    for token_id, entry in zip(token_ids, entries):
        own = (entry or {}).get(token_id)
        token = _decode(tokenizer, token_id, own)
        content.append({
            "token": token, "logprob": _value(own) if own is not None else _FLOOR,
            "bytes": list(token.encode("utf-8")),
            "top_logprobs": [
                {"token": (t := _decode(tokenizer, tid, lp)), "logprob": _value(lp),
                 "bytes": list(t.encode("utf-8"))}
                for tid, lp in _ranked(entry or {}, num)],
        })
    return {"content": content}


def prompt_logprobs_json(tokenizer, entries: list | None) -> list | None:
    """vLLM's `prompt_logprobs`: per prompt position None or {token_id: {logprob, rank,
    decoded_token}}."""
    if entries is None:
        return None
    return [None if e is None else {
        str(t): {"logprob": _value(lp), "rank": getattr(lp, "rank", None),
                 "decoded_token": _decode(tokenizer, t, lp)} for t, lp in e.items()}
        for e in entries]
