"""A PEFT LoRA adapter on disk (`adapter_config.json` + `adapter_model.safetensors`), checked
and read (vLLM's PEFTHelper and LoRAModel.from_local_checkpoint).

`read_adapter` checks everything the engine can check without the model's weights: the
files, the config (rank against max_lora_rank, features LoRA serving here does not apply),
and each tensor's name and rank from the safetensors header alone, so that the front end
refuses a bad adapter before a request is queued. `load_adapter` then reads the tensors, with
the scaling (lora_alpha / r, or / sqrt(r) for rsLoRA) folded into B, keyed by the base
checkpoint's weight name that each adapts.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import numpy as np

# Modules an adapter may target: they map onto the engine's fused qkv_proj, o_proj,
# gate_up_proj and down_proj (jaxvllm/worker/lora_manager.py).
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# base_model.model.<module>.lora_A[.<adapter name>].weight
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")
# Config fields whose non-default values change the computation in ways not applied here.
_UNSUPPORTED = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
                "alpha_pattern": {}, "lora_bias": False}


@dataclass(frozen=True)
class AdapterInfo:
    """What read_adapter found: the config's alpha and rsLoRA flag, each adapted module's
    rank (keyed by the base weight's name, e.g. model.layers.0.self_attn.q_proj.weight)."""
    path: str
    lora_alpha: float
    use_rslora: bool
    ranks: dict

    def scaling(self, r: int) -> float:
        return self.lora_alpha / (math.sqrt(r) if self.use_rslora else r)


def read_adapter(path: str, max_lora_rank: int, name: str = "") -> AdapterInfo:
    """The adapter's config and tensor names checked; ValueError naming what is wrong."""
    what = f"LoRA adapter {name!r} ({path})" if name else f"LoRA adapter {path}"
    if not path or not os.path.isdir(path):
        raise ValueError(f"{what}: no such directory (lora_path must be a local PEFT adapter directory).")
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        if not os.path.isfile(os.path.join(path, file)):
            raise ValueError(f"{what}: {file} is missing.")
    try:
        with open(os.path.join(path, CONFIG_FILE), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: {CONFIG_FILE} could not be read: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{what}: {CONFIG_FILE} must hold a JSON object.")
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{what}: peft_type {config['peft_type']!r} is not supported (only LORA).")
    for field, default in _UNSUPPORTED.items():
        value = config.get(field)
        if value and value != default:  # absent, empty or the default: plain LoRA
            raise ValueError(f"{what}: {field}={value!r} is not supported.")
    r = config.get("r")
    if not isinstance(r, int) or r < 1:
        raise ValueError(f"{what}: r must be a positive integer, got {r!r}.")
    targets = config.get("target_modules") or []
    if isinstance(targets, list):  # a string is a regex; the tensors below are checked instead
        for module in targets:
            _check_module(what, module.split(".")[-1])
    ranks = {}
    for key, shape in _header(what, path).items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"{what}: tensor {key!r} is not a LoRA A or B weight.")
        module = m["module"]
        _check_module(what, module.split(".")[-1])
        if len(shape) != 2:
            raise ValueError(f"{what}: tensor {key!r} has shape {shape}; LoRA weights are matrices.")
        rank = shape[0] if m["ab"] == "A" else shape[1]
        if rank > max_lora_rank:
            raise ValueError(f"{what}: rank {rank} of {module} is larger than max_lora_rank={max_lora_rank}.")
        if ranks.setdefault(module + ".weight", rank) != rank:
            raise ValueError(f"{what}: the A and B weights of {module} disagree on the rank.")
    if not ranks:
        raise ValueError(f"{what}: {WEIGHTS_FILE} holds no LoRA weights.")
    return AdapterInfo(path, float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False)), ranks)


def load_adapter(info: AdapterInfo) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{base weight name: (A [r, in], B [out, r] times the scaling)} in float32."""
    from safetensors.numpy import load_file
    try:
        tensors = load_file(os.path.join(info.path, WEIGHTS_FILE))
    except Exception as e:  # safetensors raises its own error type for a damaged file
        raise ValueError(f"LoRA adapter {info.path}: {WEIGHTS_FILE} could not be read: {e}") from None
    pairs: dict[str, dict] = {}
    for key, value in tensors.items():
        m = _KEY.match(key)
        pairs.setdefault(m["module"] + ".weight", {})[m["ab"]] = value.astype(np.float32)
    out = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {info.path}: {module} has lora_{''.join(ab)} but not both A and B.")
        out[module] = (ab["A"], ab["B"] * np.float32(info.scaling(ab["A"].shape[0])))
    return out


def _check_module(what: str, module: str) -> None:
    if module not in SUPPORTED_MODULES:
        raise ValueError(f"{what}: target module {module!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_MODULES)}).")


def _header(what: str, path: str) -> dict[str, list[int]]:
    """Tensor names and shapes from the safetensors header, without reading the tensors."""
    file = os.path.join(path, WEIGHTS_FILE)
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= os.path.getsize(file) - 8:
                raise ValueError(f"header length {size} does not fit the file")
            header = json.loads(f.read(size))
        return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{what}: {WEIGHTS_FILE} is not a valid safetensors file ({e}).") from None
