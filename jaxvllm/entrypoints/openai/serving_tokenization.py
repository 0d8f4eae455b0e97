"""vLLM's tokenizer endpoints: POST /tokenize, POST /detokenize, GET /tokenizer_info.

Clients (benchmarks, evaluation harnesses) use them to count tokens exactly as the
server will, chat template included."""
from __future__ import annotations

import asyncio

from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):
    async def tokenize(self, request: TokenizeRequest) -> dict:
        """Off the event loop, as every tokenization of a client's text is."""
        self.check_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise APIError("Give exactly one of prompt or messages.", 400, "prompt")
        if request.messages is not None:
            ids = await self.chat_renderer.render(
                request.messages, request.add_generation_prompt, request.continue_final_message,
                request.chat_template_kwargs, request.chat_template,
                [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None)
        else:
            ids = await asyncio.to_thread(self.tokenizer.encode, request.prompt,
                                          add_special_tokens=request.add_special_tokens)
        out = {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}
        if request.return_token_strs:
            out["token_strs"] = self.tokenizer.convert_ids_to_tokens(ids)
        return out

    async def detokenize(self, request: DetokenizeRequest) -> dict:
        self.check_model(request.model)
        bad = [t for t in request.tokens if not 0 <= t < len(self.tokenizer)]
        if bad:
            raise APIError(f"tokens must lie in [0, {len(self.tokenizer)}); got {bad[:5]}.", 400, "tokens")
        return {"prompt": await asyncio.to_thread(self.tokenizer.decode, request.tokens)}

    def tokenizer_info(self) -> dict:
        tok = self.tokenizer
        return {
            "tokenizer_class": type(tok).__name__, "vocab_size": len(tok),
            "model_max_length": self.max_model_len,
            **{f"{name}_token{suffix}": getattr(tok, f"{name}_token{suffix}", None)
               for name in ("bos", "eos", "pad", "unk") for suffix in ("", "_id")},
            "chat_template": getattr(tok, "chat_template", None),
        }
