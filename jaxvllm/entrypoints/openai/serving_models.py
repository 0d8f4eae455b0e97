"""The models a server answers to (vLLM's OpenAIServingModels): the base model and its LoRA
adapters, those of --lora-modules and those loaded at run time, in one registry that every
endpoint shares; and vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter, served with
--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true), behind the API key,
loading only from the --lora-dir roots."""
from __future__ import annotations

import asyncio
import os

from fastapi import Request, Response

from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.protocol import OpenAIBaseModel
from jaxvllm.entrypoints.openai.request_body import parse_body
from jaxvllm.entrypoints.openai.server_args import ServerArgs
from jaxvllm.lora.request import LoRARequest


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str


class OpenAIServingModels:
    def __init__(self, base_model_name: str, server_args: ServerArgs):
        self.base_model_name = base_model_name
        self.lora_requests: dict[str, LoRARequest] = server_args.lora_requests()
        # Ids are never reused: the engine remembers which adapter an id named.
        self._next_id = len(self.lora_requests) + 1
        self.in_flight: dict[str, set[str]] = {}  # adapter name -> ids of its requests being served
        self.roots = [os.path.realpath(d) for d in server_args.lora_dirs]

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names (None: the base model); 404 if neither."""
        if model in self.lora_requests:
            return self.lora_requests[model]
        if model and model != self.base_model_name:
            shown = model if len(model) <= 100 else model[:100] + "..."  # not echoed whole
            served = ", ".join(f"`{m}`" for m in [self.base_model_name, *self.lora_requests])
            raise APIError(f"The model `{shown}` does not exist; this server serves {served}.", 404, "model")
        return None

    def start(self, lora: LoRARequest | None, request_id: str) -> None:
        """The request is in flight on its adapter: unloading that adapter is refused until `finish`."""
        if lora is not None:
            self.in_flight.setdefault(lora.lora_name, set()).add(request_id)

    def finish(self, lora: LoRARequest | None, request_id: str) -> None:
        if lora is not None:
            self.in_flight.get(lora.lora_name, set()).discard(request_id)

    async def load(self, name: str, path: str, check) -> LoRARequest:
        """check(lora): the engine's adapter check (ValueError naming what is wrong)."""
        if name in self.lora_requests or name == self.base_model_name:
            raise APIError(f"The model `{name}` is served already; unload it first.", 400, "lora_name")
        real = os.path.realpath(path)
        if not any(real == root or real.startswith(root + os.sep) for root in self.roots):
            raise APIError(f"lora_path {path!r} lies outside the directories adapters may be loaded "
                           f"from (--lora-dir).", 400, "lora_path")
        lora = LoRARequest(name, self._next_id, real)
        try:
            await asyncio.to_thread(check, lora)
        except ValueError as e:
            raise APIError(str(e), 400, "lora_path") from e
        self._next_id += 1
        self.lora_requests[name] = lora
        return lora

    def unload(self, name: str) -> None:
        if name not in self.lora_requests:
            raise APIError(f"The LoRA adapter `{name}` is not loaded.", 404, "lora_name")
        busy = sorted(self.in_flight.get(name, ()))
        if busy:
            raise APIError(f"The LoRA adapter `{name}` serves {len(busy)} request(s) in flight "
                           f"({', '.join(busy[:5])}); unload it when they finish.", 409, "lora_name")
        del self.lora_requests[name]
        self.in_flight.pop(name, None)


def add_lora_routes(app, models: OpenAIServingModels, engine) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(raw: Request):
        body = await parse_body(raw, LoadLoRAAdapterRequest)
        await models.load(body.lora_name, body.lora_path, engine.processor.check_lora)
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", 200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(raw: Request):
        body = await parse_body(raw, UnloadLoRAAdapterRequest)
        models.unload(body.lora_name)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", 200)
