"""The `jaxvllm` command line, run as a user runs it (a subprocess), on a tiny model."""
from __future__ import annotations

import subprocess
import sys


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "jaxvllm.entrypoints.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_generate_prints_prompt_and_completion(tiny_model_dir):
    # The tiny model's vocabulary is the tokenizer's first 256 ids: single characters.
    proc = run_cli("generate", "a", "1 2", "--model", str(tiny_model_dir), "--max-tokens", "5",
                   "--max-model-len", "128", "--max-num-seqs", "4", "--max-num-batched-tokens", "32",
                   "--block-size", "16", "--num-gpu-blocks-override", "32", "--skip-warmup")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("### Prompt:") == 2
    assert "### Prompt: 1 2" in proc.stdout and "### Completion:" in proc.stdout


def test_bad_path_gives_clear_error():
    proc = run_cli("generate", "hi", "--model", "/no/such/model")
    assert proc.returncode == 2
    assert "Model path does not exist: /no/such/model" in proc.stderr


def test_bad_engine_value_gives_clear_error(tiny_model_dir):
    proc = run_cli("generate", "hi", "--model", str(tiny_model_dir), "--block-size", "7")
    assert proc.returncode == 2
    assert "block_size must be one of" in proc.stderr
