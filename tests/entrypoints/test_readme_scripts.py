"""Every Python and shell block of README.md and docs/*.md runs as written, the pages read in
PAGES' order (a fenced block without a language is a diagram). A new block that no runner
below claims fails the plan test, and so does a page missing from PAGES.

To keep the suite's time, blocks share what they can: the offline Python blocks run as one
session in one subprocess (the later ones continue the README's `llm` and `params`, as the
pages say), saved as a script without an `if __name__ == "__main__":` guard (the engine
processes must start without re-running it), with nothing logged after its own output; the
shell blocks run in page order in one working directory (later ones use what earlier ones
wrote); a block that starts `jaxvllm serve` in the foreground is started, waited for on
/health, used by the client blocks that follow it, and stopped with SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
# The README, then the docs pages in the order their blocks run: the serving page's clients
# use the README's server; scaling-out.md loads the checkpoint sleep-mode.md converts.
PAGES = ["README.md", "docs/serving.md", "docs/python-api.md", "docs/cli.md", "docs/tools-and-reasoning.md",
         "docs/sleep-mode.md", "docs/scaling-out.md", "docs/quantization.md", "docs/speculative-decoding.md",
         "docs/lora.md", "docs/kv-connectors.md", "docs/disaggregated-prefill.md", "docs/structured-outputs.md",
         "docs/compile.md", "docs/benchmarks.md", "docs/models.md",
         "docs/design.md"]
LOG_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
SERVER = "http://127.0.0.1:8000"


def readme_blocks() -> list[tuple[str, str, str]]:
    """(nearest heading, language, code) of every fenced block with a language, page by page."""
    out = []
    for page in PAGES:
        heading = ""
        for part in re.split(r"(^#+ [^\n]*$|^```\w*\n.*?^```$)", (REPO / page).read_text(), flags=re.M | re.S):
            if part.startswith("#"):
                heading = part.lstrip("#").strip()
            elif part.startswith("```"):
                lang, _, code = part[3:-3].partition("\n")
                if lang:
                    out.append((heading, lang, code))
    return out


def runner(block: tuple[str, str, str]) -> str:
    """Which runner takes a block."""
    heading, lang, code = block
    if lang == "bash" and code.startswith("make "):
        return "make"
    if lang == "bash" and heading.startswith("A second model to try offline"):
        return "gemma"
    if lang == "python" and "OpenAI(" in code or lang == "json":
        return "client"
    if lang == "python":
        return "session"
    if lang == "bash" and ("curl" in code and "jaxvllm serve" not in code):
        return "client"
    if lang == "bash":
        return "shell"
    raise AssertionError(f"no runner for a ```{lang} block under {heading!r}")


def plan() -> dict[str, list[tuple[str, str, str]]]:
    runs: dict[str, list] = {"make": [], "gemma": [], "session": [], "shell": [], "client": []}
    for block in readme_blocks():
        runs[runner(block)].append(block)
    return runs


def test_every_block_has_a_runner():
    runs = plan()
    assert sum(map(len, runs.values())) == len(readme_blocks())
    assert all(runs.values()), {k: len(v) for k, v in runs.items()}
    assert sorted(PAGES[1:]) == sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))


def test_every_relative_link_resolves():
    for page in PAGES:
        for target in re.findall(r"\[[^\]]+\]\(([^)#:\s]+)(?:#[^)]*)?\)", (REPO / page).read_text()):
            assert (REPO / page).parent.joinpath(target).exists(), (page, target)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A working directory as the README assumes one: .venv (this interpreter's), configs/, tests/."""
    work = tmp_path_factory.mktemp("readme")
    (work / ".venv").symlink_to(Path(sys.prefix))
    for name in ("configs", "tests"):
        (work / name).symlink_to(REPO / name)
    return work


def environment() -> dict[str, str]:
    return os.environ | {"PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def run(args: list[str], cwd: Path, timeout: float = 900) -> str:
    """Its stdout and stderr in one pipe, in the order they were written."""
    done = subprocess.run(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=environment())
    assert done.returncode == 0, done.stdout[-4000:]
    assert "Traceback" not in done.stdout, done.stdout[-4000:]
    return done.stdout


def run_bash(code: str, cwd: Path, timeout: float = 900) -> str:
    return run(["bash", "-e", "-c", code], cwd, timeout)


def test_setup_block_names_real_make_targets():
    """`make run` / `make test` set up the environment this suite runs in (and `make test` runs
    the suite itself): checked with `make -n`, which expands every command without running it."""
    (_, _, code), = plan()["make"]
    targets = [line.split()[1] for line in code.splitlines() if line.startswith("make ")]
    assert targets == ["run", "test"]
    run(["make", "-n", *targets], REPO)


@pytest.mark.slow
def test_offline_python_blocks_run_as_one_session(workdir):
    start = time.time()
    script = workdir / "session.py"
    script.write_text("\n".join(code for _, _, code in plan()["session"]))
    out = run([sys.executable, str(script)], workdir)
    assert "The capital of France is ->" in out and "def fibonacci(n): ->" in out
    last_line = out.rstrip("\n").splitlines()[-1]
    assert not LOG_RECORD.search(last_line), f"logged after the output: {last_line!r}"
    assert "Unable to initialize backend" not in out  # jax's probes of absent devices
    traces = (Path("/tmp/jaxvllm-trace") / "plugins" / "profile").glob("*/*.xplane.pb")
    assert any(t.stat().st_mtime >= start for t in traces)  # the profiling block's trace


def _start(code: str, cwd: Path) -> subprocess.Popen:
    proc = subprocess.Popen(["bash", "-e", "-c", code], cwd=cwd, env=environment(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        try:
            if httpx.get(SERVER + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    _stop(proc)
    raise TimeoutError("the README's server did not become healthy")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert "Traceback" not in out, out[-4000:]


def _check_error_example(code: str) -> None:
    """The README's error body is what the server answers to that mistake."""
    shown = json.loads(code)
    field = shown["error"]["param"]
    r = httpx.post(SERVER + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "x",
                                                    field: -1.0}, timeout=60)
    assert r.status_code == 400 and r.json() == shown


@pytest.mark.slow
def test_shell_blocks_and_their_clients_run_in_order(workdir):
    """Each client block asks the server of the last shell block before it."""
    proc = None
    try:
        for heading, lang, code in [b for b in readme_blocks() if runner(b) in ("shell", "client")]:
            if runner((heading, lang, code)) == "client":
                assert proc is not None, f"a client block under {heading!r} follows no server"
                if lang == "json":
                    _check_error_example(code)
                elif lang == "python":
                    (workdir / "client.py").write_text(code)
                    assert run([sys.executable, "client.py"], workdir).strip()
                else:
                    assert '"choices"' in run_bash(code, workdir)
                continue
            if proc is not None:
                _stop(proc)
                proc = None
            start = time.monotonic()
            if "jaxvllm serve" not in code or "&" in code:  # a server in the background stops itself
                run_bash(code, workdir)
                print(f"{heading}: {time.monotonic() - start:.1f} s")
            else:
                proc = _start(code, workdir)
                print(f"{heading} (server up): {time.monotonic() - start:.1f} s")
    finally:
        if proc is not None:
            _stop(proc)


@pytest.mark.slow
def test_gemma_block_builds_and_runs_the_model(workdir):
    (_, _, code), = plan()["gemma"]
    out = run_bash(code, workdir, timeout=1500)
    assert "### Completion:" in out


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
