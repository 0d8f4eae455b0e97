"""The `jaxvllm` command line, run as a user runs it (a subprocess), on a tiny model."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


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


def test_version_and_the_api_server_module():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == "jaxvllm 0.1.0"
    proc = subprocess.run([sys.executable, "-m", "jaxvllm.entrypoints.openai.api_server", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: jaxvllm serve"), proc.stderr


def test_list_models_prints_the_registry(capsys):
    from jaxvllm.entrypoints.cli import main
    from jaxvllm.models.registry import supported_architectures
    with pytest.raises(SystemExit) as exit_:
        main(["--list-models"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.split() == supported_architectures()
    assert {"Gemma2ForCausalLM", "Gemma3ForCausalLM", "LlamaForCausalLM", "OPTForCausalLM",
            "Phi3ForCausalLM", "Qwen3ForCausalLM"} <= set(supported_architectures())


def test_every_engine_flag_has_help_and_default():
    import dataclasses

    from jaxvllm.config import EngineArgs, attribute_docs

    help = subprocess.run([sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve", "--help"],
                          capture_output=True, text=True, timeout=60,
                          env=os.environ | {"COLUMNS": "10000"})  # no line wrapping
    text = " ".join(help.stdout.split())
    docs = attribute_docs(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        assert docs.get(f.name), f"EngineArgs.{f.name} has no docstring"
        if f.name != "seed":
            assert docs[f.name][:40] in text, f.name
            if f.default is not None:
                assert f"{docs[f.name][-20:]} (default: {f.default})" in text, f.name


@pytest.mark.parametrize("args,message", [
    (["/no/such/model"], "Model path does not exist: /no/such/model"),
    (["no-such-org/no-such-model"], "is neither a local path"),
    (["--block-size", "7"], "block_size must be one of"),
    (["--quantization", "int4"], "quantization must be one of"),
    (["--max-n", "0"], "max_n must be at least 1"),
])
def test_serve_reports_bad_arguments_in_one_line(tiny_model_dir, args, message):
    model = [] if not args[0].startswith("--") else [str(tiny_model_dir)]
    with socket.socket() as s:  # a free port: 8000 may be another test's server
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    proc = subprocess.run([sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve", *model, *args, "--port", port],
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_flags_are_never_prefix_matched(tmp_path):
    from jaxvllm.entrypoints.cli import build_parser

    template = tmp_path / "x.jinja"
    template.write_text("{{ messages[0].content }}")
    ns = build_parser().parse_args(["serve", "--chat-template", str(template)])
    assert ns.chat_template == str(template) and ns.chat_template_timeout_s == 2.0
    ns = build_parser().parse_args(["serve", "--chat-template-timeout", "3"])
    assert ns.chat_template_timeout_s == 3.0 and ns.chat_template is None


@pytest.mark.parametrize("args,message", [
    (["serve", "--chat-templ", "x.jinja"],
     "jaxvllm serve: error: unrecognized argument --chat-templ; did you mean --chat-template?"),
    (["serve", "--max-num-seq", "4"],  # an abbreviation argparse would have taken
     "jaxvllm serve: error: unrecognized argument --max-num-seq; did you mean --max-num-seqs?"),
    (["generate", "hi", "--max-tokenz=3"],
     "jaxvllm generate: error: unrecognized argument --max-tokenz=3; did you mean --max-tokens?"),
    (["serve", "--port", "abc"],
     "jaxvllm serve: error: argument --port: invalid int value: 'abc' (see jaxvllm serve --help)"),
])
def test_a_wrong_flag_gets_one_line_naming_the_nearest(capsys, args, message):
    from jaxvllm.entrypoints.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""


def test_vllm_arguments_are_accepted_or_refused_by_name(caplog):
    from jaxvllm.vllm_compat import pop_vllm_args

    with caplog.at_level("WARNING"):
        kept = pop_vllm_args({"enforce_eager": True, "trust_remote_code": True, "max_model_len": 64,
                              "cpu_offload_gb": 0})
    assert kept == {"max_model_len": 64}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "enforce_eager" in warned[0] and "trust_remote_code" in warned[1]
    with pytest.raises(ValueError, match="cpu_offload_gb=2 is not supported"):
        pop_vllm_args({"cpu_offload_gb": 2})


def test_a_hub_id_resolves_from_the_local_cache_offline(tiny_model_dir, tmp_path):
    """The cache as huggingface_hub writes it: blobs by hash, snapshots of symlinks, refs."""
    import hashlib

    repo = tmp_path / "hub" / "models--someorg--tiny-llama"
    snapshot = repo / "snapshots" / ("c0ffee" * 6 + "c0ff")
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in tiny_model_dir.iterdir():
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    proc = subprocess.run([sys.executable, "-m", "jaxvllm.entrypoints.cli", "generate", "a",
                           "--model", "someorg/tiny-llama", "--max-tokens", "3", "--max-model-len", "128",
                           "--max-num-seqs", "4", "--num-gpu-blocks-override", "32", "--skip-warmup"],
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert proc.returncode == 0, proc.stderr
    assert "### Completion:" in proc.stdout


def test_serve_on_a_busy_port_fails_before_the_engine_loads(tiny_model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve",
                               str(tiny_model_dir), "--port", str(port), "--skip-warmup"],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert f"Cannot serve on 127.0.0.1:{port}: Address already in use" in proc.stderr, proc.stderr
    assert "KV cache" not in proc.stderr  # the engine never started
