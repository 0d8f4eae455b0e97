"""The pooling endpoints (a server started with --runner pooling): /v1/embeddings as OpenAI
specifies it (float or base64 vectors, `dimensions`, `usage`; vLLM's chat-style `messages`
too), /pooling, /classify, /score and /rerank (Jina's and Cohere's shape), one engine
request per input. A generate server answers them with a 400 naming --runner pooling."""
from __future__ import annotations

import asyncio
import base64

import numpy as np

from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.protocol_replies import UsageInfo
from jaxvllm.entrypoints.openai.serving_engine import OpenAIServing
from jaxvllm.outputs import PoolingRequestOutput
from jaxvllm.pooling_params import PoolingParams


class OpenAIServingPooling(OpenAIServing):
    def check_pooling(self, model: str | None) -> None:
        self.check_model(model)
        if self.engine.vllm_config.model.runner != "pooling":
            raise APIError("This endpoint needs a pooling model: start the server with --runner pooling "
                           "(this one generates: use /v1/completions or /v1/chat/completions).", 400)
        self.check_engine()

    async def _token_ids(self, inputs, param: str, add_special_tokens: bool, truncate: int | None
                         ) -> list[list[int]]:
        """Every input form OpenAI takes (a string, strings, token ids, token-id lists) as
        token-id lists, truncated to their last `truncate` tokens, checked against the model."""
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not inputs:
            raise APIError(f"{param} must not be empty.", 400, param)
        if len(inputs) > (most := self.server_args.max_prompts_per_request):
            raise APIError(f"{param} may hold at most {most} inputs on this server (--max-prompts-per-request), "
                           f"got {len(inputs)}.", 400, param)
        out = []
        for i, one in enumerate(inputs):
            name = param if len(inputs) == 1 else f"{param}[{i}]"
            ids = (await asyncio.to_thread(self.tokenizer.encode, one, add_special_tokens=add_special_tokens)
                   if isinstance(one, str) else list(one))
            if truncate is not None:
                ids = ids[-(self.max_model_len - 1 if truncate == -1 else truncate):]
            if not ids:
                raise APIError(f"{name} must not be empty.", 400, param)
            if bad := [t for t in ids if not 0 <= t < self.vocab_size]:
                raise APIError(f"{name} holds token ids outside [0, {self.vocab_size}): {bad[:5]}.", 400, param)
            if len(ids) >= self.max_model_len:
                raise APIError(f"This model's maximum context length is {self.max_model_len} tokens, but "
                               f"{name} has {len(ids)} tokens; shorten it or set truncate_prompt_tokens.",
                               400, param)
            out.append(ids)
        return out

    async def _pool(self, token_ids: list[list[int]], params: PoolingParams, request_id: str,
                    priority: int = 0) -> list[PoolingRequestOutput]:
        results: list = [None] * len(token_ids)
        async for i, out in self.generate_all([{"prompt_token_ids": ids} for ids in token_ids],
                                              [params] * len(token_ids), request_id, priority):
            results[i] = out
        return results

    def _reply(self, request_id: str, data: list, outputs) -> dict:
        tokens = sum(len(o.prompt_token_ids) for o in outputs)
        return {"id": request_id, "object": "list", "created": self.created(), "model": self.model_name,
                "data": data, "usage": UsageInfo.of(tokens, 0).dump()}

    # ---- endpoints ----------------------------------------------------------------
    async def create_embedding(self, request, request_id: str, pooling: bool = False) -> dict:
        """/v1/embeddings, or (pooling) /pooling: the pooled data of the request's task."""
        self.check_pooling(request.model)
        convert = self.engine.vllm_config.model.convert
        task = (getattr(request, "task", None) or ("classify" if convert == "classify" else "embed")
                if pooling else "embed")
        if (request.input is None) == (request.messages is None):
            raise APIError("Give exactly one of input or messages.", 400, "input")
        if request.messages is not None:
            ids = [await self.chat_renderer.render(request.messages, add_generation_prompt=False)]
            ids = await self._token_ids(ids, "messages", False, request.truncate_prompt_tokens)
        else:
            ids = await self._token_ids(request.input, "input", request.add_special_tokens,
                                        request.truncate_prompt_tokens)
        if request.dimensions is not None and convert == "embed" and not self.engine.vllm_config.model.is_matryoshka:
            raise APIError(f"dimensions: model {self.model_name!r} does not support Matryoshka "
                           f"representation.", 400, "dimensions")
        outputs = await self._pool(ids, request.to_pooling_params(
            dimensions=request.dimensions, normalize=request.normalize, task=task), request_id, request.priority)
        data = []
        for i, out in enumerate(outputs):
            vector = np.asarray(out.outputs.data, np.float32)
            value = (base64.b64encode(vector.astype("<f4").tobytes()).decode()
                     if request.encoding_format == "base64" else vector.tolist())
            data.append({"index": i, "object": "pooling", "data": value} if pooling else
                        {"index": i, "object": "embedding", "embedding": value})
        return self._reply(request_id, data, outputs)

    async def create_classify(self, request, request_id: str) -> dict:
        self.check_pooling(request.model)
        ids = await self._token_ids(request.input, "input", request.add_special_tokens,
                                    request.truncate_prompt_tokens)
        outputs = await self._pool(ids, request.to_pooling_params(
            task="classify", use_activation=request.use_activation), request_id, request.priority)
        labels = getattr(self.engine.vllm_config.model.hf_config, "id2label", None) or {}
        data = []
        for i, out in enumerate(outputs):
            probs = np.asarray(out.outputs.data, np.float32).tolist()
            best = int(np.argmax(probs))
            data.append({"index": i, "label": labels.get(best, str(best)), "probs": probs,
                         "num_classes": len(probs)})
        return self._reply(request_id, data, outputs)

    async def _scores(self, request, texts_1: list[str], texts_2: list[str], request_id: str,
                      param_1: str, param_2: str) -> tuple[list[float], list]:
        """vLLM's score: the cosine of the embeddings (embedding model) or the one-label
        cross-encoder's output on each (text_1, text_2) pair."""
        self.check_pooling(request.model)
        if len(texts_1) == 1:
            texts_1 = texts_1 * len(texts_2)
        if not texts_2:
            raise APIError(f"{param_2} must not be empty.", 400, param_2)
        if len(texts_1) != len(texts_2):
            raise APIError(f"{param_1} must hold one text or as many as {param_2} ({len(texts_2)}); "
                           f"got {len(texts_1)}.", 400, param_1)
        model, truncate = self.engine.vllm_config.model, request.truncate_prompt_tokens
        if model.convert == "embed":
            ids = await self._token_ids(texts_1 + texts_2, param_1, True, truncate)
            outs = await self._pool(ids, request.to_pooling_params(task="embed", normalize=True),
                                    request_id, request.priority)
            n = len(texts_1)
            return [float(a.outputs.data @ b.outputs.data) for a, b in zip(outs[:n], outs[n:])], outs
        if getattr(model.hf_config, "num_labels", 1) != 1:
            raise APIError(f"Scores need an embedding model or a one-label classifier; this model has "
                           f"{model.hf_config.num_labels} labels (use /classify).", 400)
        pairs = [self.tokenizer(a, b)["input_ids"] for a, b in zip(texts_1, texts_2)]
        ids = await self._token_ids(pairs, param_2, True, truncate)
        outs = await self._pool(ids, request.to_pooling_params(task="score", use_activation=request.use_activation),
                                request_id, request.priority)
        return [float(np.asarray(o.outputs.data).reshape(-1)[0]) for o in outs], outs

    async def create_score(self, request, request_id: str) -> dict:
        as_list = lambda t: [t] if isinstance(t, str) else list(t)  # noqa: E731
        scores, outs = await self._scores(request, as_list(request.text_1), as_list(request.text_2),
                                          request_id, "text_1", "text_2")
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return self._reply(request_id, data, outs)

    async def create_rerank(self, request, request_id: str) -> dict:
        if request.top_n is not None and request.top_n < 0:
            raise APIError(f"top_n must not be negative, got {request.top_n}.", 400, "top_n")
        scores, outs = await self._scores(request, [request.query], request.documents, request_id,
                                          "query", "documents")
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:request.top_n or None]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": request.documents[i]}} if request.return_documents else {})}
                   for i in order]
        tokens = sum(len(o.prompt_token_ids) for o in outs)
        return {"id": request_id, "model": self.model_name, "usage": {"total_tokens": tokens},
                "results": results}
