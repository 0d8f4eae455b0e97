"""Write a model that jaxvllm loads (GGUF or safetensors) as a float32 safetensors
directory with its config and tokenizer: the form vLLM and transformers read.

    python benchmarks/peers/export_safetensors.py [MODEL] OUT_DIR
"""
from __future__ import annotations

import argparse
import os

from safetensors.numpy import save_file

from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import architecture
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.model_path import resolve_model
from jaxvllm.transformers_utils.tokenizer import load_tokenizer


def export(model: str | None, out_dir: str) -> str:
    if os.path.exists(os.path.join(out_dir, "model.safetensors")):
        return out_dir
    path = resolve_model(model)
    os.makedirs(out_dir, exist_ok=True)
    config = load_hf_config(path)
    config.dtype = "float32"
    config.architectures = [architecture(config)]  # a GGUF's config has none; vLLM needs it
    config.save_pretrained(out_dir)
    load_tokenizer(path).save_pretrained(out_dir)
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(load_weights(path), tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    return out_dir


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("out_dir")
    ns = parser.parse_args()
    print(export(ns.model, ns.out_dir))
