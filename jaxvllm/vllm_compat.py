"""vLLM engine arguments that have no meaning here, so that scripts and command lines
written for vLLM run unchanged: IGNORED ones are accepted with one warning each (saying
why), REFUSED ones are accepted only at their neutral value and otherwise rejected with an
error that says what is missing. Every other vLLM argument jaxvllm has is an EngineArgs
field of the same name."""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

IGNORED = {
    "enforce_eager": "XLA compiles every step; there is no eager mode or CUDA graph to turn off",
    "trust_remote_code": "jaxvllm runs its own model code only, never a checkpoint's",
    "disable_log_stats": "jaxvllm logs no periodic stats; /metrics serves them",
    "disable_log_requests": "jaxvllm does not log requests",
    "tokenizer_mode": "the Hugging Face fast tokenizer is always used",
    "max_seq_len_to_capture": "there are no CUDA graphs; shapes are bucketed instead",
    "disable_custom_all_reduce": "XLA chooses the collectives",
    "compilation_config": "XLA compiles the whole step; its flags are the platform's",
}
# name: (neutral value, what to say when another value is given)
REFUSED = {
    "enable_lora": (False, "LoRA adapters are not supported"),
    "cpu_offload_gb": (0, "weights cannot be offloaded to host memory"),
}


def pop_vllm_args(kwargs: dict) -> dict:
    """kwargs without the IGNORED and REFUSED names (warning, or ValueError, as due)."""
    for name, why in IGNORED.items():
        if name in kwargs:
            value = kwargs.pop(name)
            logger.warning("Ignoring vLLM's %s=%r: %s.", name, value, why)
    for name, (neutral, why) in REFUSED.items():
        if name in kwargs:
            value = kwargs.pop(name)
            if value not in (neutral, None):
                raise ValueError(f"{name}={value!r} is not supported: {why}.")
    return kwargs


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's flags for the names above, grouped in --help as accepted for compatibility."""
    group = parser.add_argument_group("vLLM arguments accepted for compatibility")
    for name, why in IGNORED.items():
        flag = "--" + name.replace("_", "-")
        if name in ("enforce_eager", "trust_remote_code", "disable_log_stats", "disable_log_requests",
                    "disable_custom_all_reduce"):
            group.add_argument(flag, action="store_true", default=None, help=f"Ignored: {why}.")
        else:
            group.add_argument(flag, default=None, help=f"Ignored: {why}.")
    for name, (neutral, why) in REFUSED.items():
        flag = "--" + name.replace("_", "-")
        kind = {bool: None, int: int}.get(type(neutral), str)
        if kind is None:
            group.add_argument(flag, action="store_true", default=None, help=f"Only {neutral}: {why}.")
        else:
            group.add_argument(flag, type=kind, default=None, help=f"Only {neutral}: {why}.")


def check_cli_args(ns: argparse.Namespace) -> None:
    """Warn about (or refuse) the vLLM flags given on a command line."""
    pop_vllm_args({name: getattr(ns, name) for name in (*IGNORED, *REFUSED)
                   if getattr(ns, name, None) is not None})
