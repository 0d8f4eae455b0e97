"""LoRA adapters served (--enable-lora --lora-modules name=path): a request's `model` picks
the adapter, /v1/models lists each with the base model as parent, an unknown model is a 404
naming what is served, and a bad adapter stops the server at start with its reason.
With --allow-runtime-lora-updating, /v1/load_lora_adapter loads from the --lora-dir roots only
and refuses a bad adapter with a 400 naming why; /v1/unload_lora_adapter refuses while the
adapter serves a request, naming it."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from openai_server import API_KEY, TINY_ENGINE_FLAGS, module_server, tiny_model
from safetensors.numpy import save_file

from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.server_args import ServerArgs
from jaxvllm.entrypoints.openai.serving_models import OpenAIServingModels

HIDDEN, HEADS, KV_HEADS, INTER = 64, 4, 2, 128  # write_tiny_llama's defaults


def write_adapter(path, r: int, targets: list[str], seed: int) -> str:
    """A random PEFT LoRA adapter for the tiny Llama, written as peft writes one."""
    rng = np.random.default_rng(seed)
    d = HIDDEN // HEADS
    shapes = {"q_proj": (HEADS * d, HIDDEN), "k_proj": (KV_HEADS * d, HIDDEN), "v_proj": (KV_HEADS * d, HIDDEN),
              "o_proj": (HIDDEN, HEADS * d), "gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN),
              "down_proj": (HIDDEN, INTER)}
    tensors = {}
    for layer in range(2):
        for module in targets:
            where = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{where}.{module}"
            out, inp = shapes[module]
            tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.2, (r, inp)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.2, (out, r)).astype(np.float32)
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": targets}))
    return str(path)


@pytest.fixture(scope="module")
def lora_server(request, tmp_path_factory):
    model = tiny_model(tmp_path_factory)
    root = tmp_path_factory.mktemp("adapters")
    a1 = write_adapter(root / "a1", 4, ["q_proj", "v_proj", "down_proj"], 1)
    a2 = write_adapter(root / "a2", 8, ["o_proj", "gate_proj", "up_proj"], 2)
    server = module_server(request, [
        str(model), *TINY_ENGINE_FLAGS, "--served-model-name", "tiny", "--api-key", API_KEY,
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules", f"a1={a1}", f"a2={a2}",
        "--allow-runtime-lora-updating", "--lora-dir", str(root)])
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        c.root = root
        yield c, model, a1


def complete(c, model: str) -> str:
    r = c.post("/v1/completions", json={"model": model, "prompt": "Hello there", "max_tokens": 8,
                                        "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_the_request_model_picks_the_adapter(lora_server):
    c, _, _ = lora_server
    texts = {m: complete(c, m) for m in ("tiny", "a1", "a2")}
    assert len(set(texts.values())) == 3  # each adapter changes the output
    assert {m: complete(c, m) for m in ("a2", "tiny", "a1")} == texts  # and only its own requests'
    r = c.post("/v1/chat/completions", json={"model": "a1", "max_tokens": 4, "temperature": 0,
                                             "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text


def test_models_lists_the_adapters_with_their_parent(lora_server):
    c, _, a1 = lora_server
    cards = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert set(cards) == {"tiny", "a1", "a2"}
    assert cards["a1"]["parent"] == "tiny" and cards["a1"]["root"] == a1 and cards["tiny"]["parent"] is None


def test_an_unknown_model_is_a_404_naming_the_served_ones(lora_server):
    c, _, _ = lora_server
    r = c.post("/v1/completions", json={"model": "a3", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 404
    assert "`tiny`, `a1`, `a2`" in r.json()["error"]["message"]


def test_a_bad_adapter_stops_the_start_with_its_reason(lora_server, tmp_path):
    _, model, a1 = lora_server
    big = write_adapter(tmp_path / "big", 16, ["q_proj"], 3)
    cmd = [sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve", str(model), *TINY_ENGINE_FLAGS,
           "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"big={big}", "--port", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "rank 16 of model.layers.0.self_attn.q_proj is larger than max_lora_rank=8" in out.stderr + out.stdout
    bad = subprocess.run(cmd[:-4] + ["--lora-modules", "no-equals-sign"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "--lora-modules takes name=path" in bad.stderr + bad.stdout


def test_adapters_load_and_unload_at_run_time(lora_server, tmp_path):
    c, _, _ = lora_server
    base = complete(c, "tiny")
    a3 = write_adapter(c.root / "a3", 4, ["k_proj", "up_proj"], 4)
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": a3})
    assert r.status_code == 200, r.text
    assert "a3" in {m["id"] for m in c.get("/v1/models").json()["data"]}
    loaded = complete(c, "a3")
    assert loaded != base
    assert c.post("/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": a3}).status_code == 400
    r = c.post("/v1/unload_lora_adapter", json={"lora_name": "a3"})
    assert r.status_code == 200, r.text
    assert c.post("/v1/completions", json={"model": "a3", "prompt": "Hi", "max_tokens": 2}).status_code == 404
    assert c.post("/v1/unload_lora_adapter", json={"lora_name": "a3"}).status_code == 404
    assert complete(c, "tiny") == base


def test_bad_loads_are_400s_naming_why(lora_server, tmp_path):
    c, _, _ = lora_server
    outside = write_adapter(tmp_path / "outside", 4, ["q_proj"], 5)
    big = write_adapter(c.root / "big", 16, ["q_proj"], 6)
    corrupt = c.root / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (corrupt / "adapter_model.safetensors").write_bytes(b"garbage")
    cases = {outside: "outside the directories", big: "rank 16 of model.layers.0.self_attn.q_proj is larger",
             str(c.root / "missing"): "no such directory", str(corrupt): "not a valid safetensors file",
             str(c.root / ".." / "outside"): "outside the directories"}
    for i, (path, message) in enumerate(cases.items()):
        r = c.post("/v1/load_lora_adapter", json={"lora_name": f"bad{i}", "lora_path": str(path)})
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert {m["id"] for m in c.get("/v1/models").json()["data"]} == {"tiny", "a1", "a2"}
    complete(c, "a1")


def test_unloading_an_adapter_in_use_is_refused_naming_the_request():
    """The registry every endpoint shares, as generate_all drives it (a request streamed from
    the tiny model ends before a client could race it, so this is checked without a server)."""
    models = OpenAIServingModels("tiny", ServerArgs(lora_modules=("a1=/adapters/a1", "a2=/adapters/a2")))
    a1 = models.resolve("a1")
    models.start(a1, "cmpl-long-one")
    models.start(None, "cmpl-base")
    with pytest.raises(APIError, match="serves 1 request.*cmpl-long-one") as e:
        models.unload("a1")
    assert e.value.status == 409
    models.unload("a2")
    models.finish(a1, "cmpl-long-one")
    models.unload("a1")
    assert models.lora_requests == {} and models.resolve("tiny") is None
