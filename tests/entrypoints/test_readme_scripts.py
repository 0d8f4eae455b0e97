"""README.md's Python examples, saved as scripts exactly as written (no `if __name__ ==
"__main__":` guard) and run in a subprocess: the engine process must start without
re-running the script, and nothing may be logged after the script's own output. Both examples
build LLM()'s default engine, so the later runs load the programs the first one compiled."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
LOG_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def readme_block(heading: str) -> str:
    """The first ```python block under a README heading."""
    section = README.read_text().split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_script(tmp_path, code: str, **env) -> str:
    """Its stdout and stderr in one pipe, in the order they were written."""
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600, env=os.environ | env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Traceback" not in done.stdout, done.stdout[-3000:]
    last_line = done.stdout.rstrip("\n").splitlines()[-1]
    assert not LOG_RECORD.search(last_line), f"logged after the output: {last_line!r}"
    assert "Unable to initialize backend" not in done.stdout  # jax's probes of absent devices
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("multiprocessing", ["0", "1"])
def test_python_api_example_runs_as_a_script(tmp_path, multiprocessing):
    out = run_script(tmp_path, readme_block("Python API"),
                     JAXVLLM_ENABLE_MULTIPROCESSING=multiprocessing)
    assert "The capital of France is ->" in out and "def fibonacci(n): ->" in out
    assert out.count("\n") > 4  # the chat answer follows the two completions


@pytest.mark.slow
def test_async_llm_example_runs_as_a_script(tmp_path):
    out = run_script(tmp_path, readme_block("Streaming from Python: AsyncLLM"))
    assert len(out.strip()) > 10


def test_chat_fills_the_rendered_prompt(tmp_path):
    """vLLM's LLM.chat returns the conversation as the chat template rendered it."""
    from conftest import write_tiny_llama
    from jaxvllm import LLM, SamplingParams
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_path())
    write_tiny_llama(tmp_path, vocab_size=len(tokenizer))
    tokenizer.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), max_model_len=128, num_gpu_blocks_override=32, skip_warmup=True)
    conv = [{"role": "user", "content": "Name a colour."}]
    out = llm.chat(conv, SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert out.prompt == tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == tokenizer.apply_chat_template(conv, add_generation_prompt=True,
                                                                 return_dict=False)
