"""A converted copy of each GGUF model, so that later starts skip parsing and dequantizing it.

Reading the default model's GGUF costs ~5 s of metadata parsing (its vocabulary is ~100k
strings) and ~3 s of dequantization, on every start. The first load writes what they produce
as a Hugging Face directory (config.json, tokenizer files, float32 model.safetensors) under
~/.cache/jaxvllm/models (JAXVLLM_MODEL_CACHE; empty disables it), named by the GGUF's path,
size and modification time, so an edited or replaced file is read afresh. Later loads read
that directory instead, the way any Hugging Face checkpoint is read.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile

import numpy as np
from safetensors.numpy import save_file

logger = logging.getLogger(__name__)
_FORMAT = 1  # part of every entry's name: bump it when what is written changes
# float32 copies of large quantized models would fill the disk; convert those with `jaxvllm convert`.
MAX_CACHED_BYTES = 4 << 30


def _entry(gguf_path: str) -> str | None:
    root = os.environ.get("JAXVLLM_MODEL_CACHE", os.path.expanduser("~/.cache/jaxvllm/models"))
    if not root:
        return None
    real = os.path.realpath(gguf_path)
    st = os.stat(real)
    key = hashlib.sha256(f"{_FORMAT}\0{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return os.path.join(root, f"{os.path.splitext(os.path.basename(real))[0]}-{key}")


def cached_hf_dir(gguf_path: str) -> str | None:
    """The converted copy of `gguf_path`, if one has been written."""
    entry = _entry(gguf_path)
    return entry if entry is not None and os.path.isdir(entry) else None


def write_cache(gguf_path: str, weights: dict[str, np.ndarray], load_config, load_tokenizer) -> None:
    """Write the converted copy, unless caching is off, one exists, or it would be too large.
    The config and tokenizer are loaded (by the callables given) only to be written.

    Written into a temporary directory and renamed into place, so a reader never sees half an
    entry and concurrent writers (several worker processes) leave exactly one. A failure (full
    or read-only disk) costs the next start its speed, nothing else.
    """
    entry = _entry(gguf_path)
    if entry is None or os.path.isdir(entry):
        return
    size = sum(w.nbytes for w in weights.values())
    if size > MAX_CACHED_BYTES:
        logger.info("Not caching a float32 copy of %s (%.1f GiB); `jaxvllm convert` writes a "
                    "checkpoint that loads without parsing the GGUF.", gguf_path, size / 2**30)
        return
    tmp = None
    try:
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(entry), prefix=".partial-")
        load_config().save_pretrained(tmp)
        load_tokenizer().save_pretrained(tmp)
        save_file(weights, os.path.join(tmp, "model.safetensors"))
        os.rename(tmp, entry)  # fails if another process got there first: theirs is as good
        tmp = None
        logger.info("Cached a converted copy of %s in %s.", gguf_path, entry)
    except OSError as e:
        if not os.path.isdir(entry):
            logger.warning("Could not cache a converted copy of %s: %s", gguf_path, e)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
