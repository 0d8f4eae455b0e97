"""LoRARequest: which adapter a request runs with (vLLM's vllm/lora/request.py).

A plain dataclass, so that it crosses processes with the request (msgpack). lora_int_id
identifies the adapter everywhere (device slots, host cache, prefix-cache keys): one id, one
adapter; 0 is reserved for "no adapter", as in vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self):
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}.")
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}.")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
