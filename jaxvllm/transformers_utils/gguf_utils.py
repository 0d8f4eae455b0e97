"""What the config, tokenizer and weight readers share about a GGUF file: how to tell one,
where to read its converted copy (gguf_cache.py), and one parsed reader for all three.

`make run` installs no torch, and transformers' own GGUF readers import it, so GGUF files are
read with the `gguf` package and fed to transformers' torch-free pieces.
"""
from __future__ import annotations

import functools
import os

import gguf

from jaxvllm.transformers_utils.gguf_cache import cached_hf_dir

# GGUF architectures whose tensors map 1:1 onto Hugging Face's Llama-style names (Qwen3's
# with its q/k norms; Gemma's with its extra norms, stored by llama.cpp as 1 + w).
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")


def is_gguf(model: str) -> bool:
    return os.path.isfile(model)  # resolve_model returns directories for everything else


def hf_source(model: str) -> str:
    """Where to read a resolved model from: for a GGUF, its cached converted copy if there is one."""
    return (cached_hf_dir(model) or model) if is_gguf(model) else model


@functools.lru_cache(maxsize=1)
def gguf_reader(path: str) -> gguf.GGUFReader:
    """One parsed GGUF, shared by the config, tokenizer and weight loaders.

    Parsing takes seconds (the vocabulary is ~100k metadata strings), and all three are loaded back to back.
    """
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # a damaged file fails in many ways (ValueError, IndexError, ...)
        raise ValueError(f"Malformed GGUF file {path}: {e!r}") from e


def check_gguf_arch(model: str, reader: gguf.GGUFReader) -> str:
    arch = reader.fields["general.architecture"].contents()
    if arch not in GGUF_ARCHS:
        raise ValueError(f"{model}: GGUF architecture {arch!r} is not supported (supported: {GGUF_ARCHS})")
    return arch
