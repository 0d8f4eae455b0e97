"""`jaxvllm convert MODEL OUT`: load a model the way the engine does (dequantized, cast,
one array per layer and weight) and save it as an Orbax checkpoint directory that
`LLM(OUT)` loads directly."""
from __future__ import annotations

import logging
import time

import jax
from flax import nnx

from jaxvllm.config import EngineArgs
from jaxvllm.distributed.mesh import make_mesh
from jaxvllm.models.model_loader import get_model
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.model_path import resolve_model
from jaxvllm.transformers_utils.orbax_checkpoint import save_checkpoint
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def convert(model: str | None, out: str, dtype: str = "auto", tensor_parallel_size: int = 1) -> None:
    """model: a GGUF file, a Hugging Face directory, or None for the default model.
    The weights are saved in the checkpoint's own head counts (no tensor-parallel padding),
    sharded over `tensor_parallel_size` devices while saving; any TP restores them."""
    start = time.perf_counter()
    path = resolve_model(model)
    hf_config = load_hf_config(path)
    config = EngineArgs(model=path, dtype=dtype, tensor_parallel_size=tensor_parallel_size
                        ).create_engine_config(hf_config, jax.default_backend())
    params = get_model(path, hf_config, make_mesh(tensor_parallel_size), dtype=config.dtype, pad_heads=False)
    save_checkpoint(out, nnx.to_pure_dict(nnx.state(params)), hf_config, load_tokenizer(path),
                    config.dtype)
    logger.info("Saved %s (%s) as an Orbax checkpoint in %s (%.1f s).", path, config.dtype, out,
                time.perf_counter() - start)
