"""Shared fixtures: tiny random-weight checkpoints written as real safetensors dirs, so the
fast tests go through the same loader as real models."""
from __future__ import annotations

import os

# The suite runs on the CPU. The test extra brings libtpu (for compiling to compile-only TPU
# devices, which needs no TPU backend): without this, every process that starts jax would
# probe for a TPU and print libtpu's warnings to stderr (inherited by the tests' subprocesses).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most of the suite's time is XLA compiling small programs that then run for milliseconds:
# with LLVM's expensive passes off the CPU compiles them 5-15% sooner. Subprocesses
# inherit it; a test may set it back.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import numpy as np
import pytest
from _pytest.nodeid import NodeId

BLOCK = 16


def pytest_collection_modifyitems(config, items):
    """Groups for pytest-xdist's `--dist loadgroup` (`make test` runs two workers): a
    module's tests stay in one worker, so its module-scoped engines and compiled programs are
    built once; the modules that use the tiny or the default model's OpenAI server share one
    worker and those servers; the modules that load the real default model (marked slow)
    take turns in one worker, as two of them side by side with the servers would not fit in
    CI's 24 GiB."""
    servers = {"tiny_server", "default_server"}
    uses_server = {item.module for item in items if servers & set(item.fixturenames)}
    slow = {item.module for item in items if item.get_closest_marker("slow")}
    for item in items:
        group = ("openai-servers" if item.module in uses_server or item.path.parent.name == "openai"
                 else "default-model" if item.module in slow else item.module.__name__)
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False) and not item.nodeid.endswith(f"@{group}"):
            # The scheduler reads the group from the node id's "@group" suffix; xdist 3.8 writes
            # it to Item._nodeid, which pytest 9 no longer reads, so without this every test was
            # its own scope and a module's fixtures were built on both workers.
            item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _free_memory() -> None:
    """Engines form reference cycles, so only a collection frees them (and their KV pools);
    malloc then keeps the freed pages unless asked to give them back."""
    import ctypes
    import gc
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


@pytest.fixture(autouse=True)
def _free_a_slow_tests_engines(request):
    """A test that loads the real default model frees it when it ends, not when the garbage
    collector next runs: its engine holds about 2 GiB."""
    yield
    if request.node.get_closest_marker("slow"):
        _free_memory()


@pytest.fixture(scope="module", autouse=True)
def _free_a_modules_memory():
    """A module's engines, compiled programs and arrays freed when it ends, so that a worker
    holds its largest module's memory, not the sum of those it ran."""
    yield
    import sys
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
    _free_memory()


def write_tiny_llama(path, *, seed=0, vocab_size=256, hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=4, num_kv_heads=2, tie=False, arch="Llama", max_position_embeddings=512,
                     **extra):
    """A random Llama-family checkpoint (config.json + model.safetensors) and its config."""
    import transformers
    from safetensors.numpy import save_file

    cfg = getattr(transformers, f"{arch}Config")(
                      vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      num_key_value_heads=num_kv_heads, max_position_embeddings=max_position_embeddings,
                      tie_word_embeddings=tie, eos_token_id=2, bos_token_id=1, **extra)
    cfg.architectures = [f"{arch}ForCausalLM"]
    rng = np.random.default_rng(seed)
    hd = hidden_size // num_heads

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": w(vocab_size, hidden_size, scale=0.5),
         "model.norm.weight": 1 + w(hidden_size, scale=0.1)}
    if not tie:
        t["lm_head.weight"] = w(vocab_size, hidden_size, scale=0.3)
    for i in range(num_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + w(hidden_size, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1 + w(hidden_size, scale=0.1)
        t[p + "self_attn.q_proj.weight"] = w(num_heads * hd, hidden_size)
        t[p + "self_attn.k_proj.weight"] = w(num_kv_heads * hd, hidden_size)
        t[p + "self_attn.v_proj.weight"] = w(num_kv_heads * hd, hidden_size)
        t[p + "self_attn.o_proj.weight"] = w(hidden_size, num_heads * hd)
        t[p + "mlp.gate_proj.weight"] = w(intermediate_size, hidden_size)
        t[p + "mlp.up_proj.weight"] = w(intermediate_size, hidden_size)
        t[p + "mlp.down_proj.weight"] = w(hidden_size, intermediate_size)
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    save_file(t, str(path / "model.safetensors"))
    return cfg, t


def write_tiny_eagle3(path, *, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=256,
                      draft_vocab_size=160, aux_layer_ids=None, own_embedding=False, seed=1) -> dict:
    """A random EAGLE-3 head in the published layout (vLLM's LlamaForCausalLMEagle3: `fc`,
    `midlayer.*`, `norm`, `lm_head` over a draft vocabulary, `d2t`, `t2d`; no embedding of its
    own unless own_embedding) for a target of hidden_size and vocab_size; aux_layer_ids: its
    eagle_config's captured layers (None: vLLM's default). Returns its tensors."""
    import json

    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    H, inter, m = hidden_size, 96, "midlayer."

    def w(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    targets = np.sort(rng.choice(vocab_size, draft_vocab_size, replace=False))
    t = {"fc.weight": w(H, 3 * H), m + "input_layernorm.weight": 1 + w(H), m + "hidden_norm.weight": 1 + w(H),
         m + "self_attn.q_proj.weight": w(num_heads * head_dim, 2 * H),
         m + "self_attn.k_proj.weight": w(num_kv_heads * head_dim, 2 * H),
         m + "self_attn.v_proj.weight": w(num_kv_heads * head_dim, 2 * H),
         m + "self_attn.o_proj.weight": w(H, num_heads * head_dim),
         m + "post_attention_layernorm.weight": 1 + w(H), m + "mlp.gate_proj.weight": w(inter, H),
         m + "mlp.up_proj.weight": w(inter, H), m + "mlp.down_proj.weight": w(H, inter),
         "norm.weight": 1 + w(H), "lm_head.weight": w(draft_vocab_size, H, scale=0.5),
         "d2t": (targets - np.arange(draft_vocab_size)).astype(np.int64),
         "t2d": np.isin(np.arange(vocab_size), targets)}
    if own_embedding:
        t["embed_tokens.weight"] = w(vocab_size, H, scale=0.5)
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"))
    eagle = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}} if aux_layer_ids else {}
    (path / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=H, intermediate_size=inter,
        num_hidden_layers=1, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512, vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size, tie_word_embeddings=False, **eagle)))
    return t


def assert_speculative_decoding_keeps(path, prompts, plain, params, configs, preempts=False, **engine_args) -> None:
    """Each speculative_config of `configs` gives the plain engine's tokens `plain` for
    `prompts` (token-id lists) on the checkpoint at `path`, with drafts made (and requests
    preempted, recomputed, if `preempts`); the model as its own draft model (method
    draft_model) has every draft accepted; every block comes back."""
    from jaxvllm import LLM
    for config in configs:
        spec = LLM(str(path), speculative_config=config, skip_warmup=True, **engine_args)
        outputs = spec.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == plain, config
        stats = spec.llm_engine.get_stats()
        assert stats.spec_decode_num_draft_tokens > 0, config
        assert spec.llm_engine.engine_core.scheduler.num_preemptions > 0 or not preempts, config
        if config["method"] == "draft_model" and config["model"] == str(path):
            assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens
        pool = spec.llm_engine.engine_core.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_blocks - 1, config
        spec.llm_engine.shutdown()


def assert_every_spec_method_keeps(path, prompts, plain, params, aux_layer_ids, own_embedding=False,
                                   **kwargs) -> None:
    """assert_speculative_decoding_keeps with every method: ngram, suffix, the model as its own
    draft model, and a random EAGLE-3 head of its shapes (written beside it) reading the
    hidden states entering aux_layer_ids."""
    from jaxvllm.transformers_utils.config import load_hf_config
    cfg = load_hf_config(str(path))
    heads = cfg.num_attention_heads
    eagle3 = path.parent / f"{path.name}-eagle3"
    write_tiny_eagle3(eagle3, hidden_size=cfg.hidden_size, num_heads=heads,
                      num_kv_heads=getattr(cfg, "num_key_value_heads", heads),
                      head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                      vocab_size=cfg.vocab_size, aux_layer_ids=aux_layer_ids, own_embedding=own_embedding)
    assert_speculative_decoding_keeps(path, prompts, plain, params, [
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        {"method": "suffix", "num_speculative_tokens": 3},
        {"method": "draft_model", "model": str(path), "num_speculative_tokens": 3},
        {"method": "eagle3", "model": str(eagle3), "num_speculative_tokens": 3}], **kwargs)


def backend_for(platform: str, attention_backend: str = "auto", *, dtype: str = "float32",
                quantization: str | None = None, tensor_parallel_size: int = 1, scheme=None):
    """The backend (jaxvllm/backends) of an engine on `platform` with these settings."""
    from jaxvllm.backends import get_backend
    from jaxvllm.config import EngineConfig, ModelConfig, ParallelConfig, QuantizationConfig
    from jaxvllm.platforms import get_platform
    config = EngineConfig(model=ModelConfig(dtype=dtype, attention_backend=attention_backend),
                          parallel=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
                          quant_config=QuantizationConfig(quantization, scheme))
    return get_backend(config, get_platform(platform))


def run_prefill(model, token_ids: list[int], num_blocks: int = 16, layer_loop=None) -> np.ndarray:
    """Logits at every position of one sequence written to pages 1..n of a fresh cache
    (the layers run in the CPU's loop unless `layer_loop` is given)."""
    import jax.numpy as jnp

    from jaxvllm.layers.attention import AttentionMetadata

    a = model.args
    n = len(token_ids)
    pages = np.arange(1, num_blocks, dtype=np.int32)
    pos = np.arange(n, dtype=np.int32)
    md = AttentionMetadata(positions=pos, slot_mapping=pages[pos // BLOCK] * BLOCK + pos % BLOCK,
                           kv_lens=np.array([n], np.int32), page_indices=pages[None],
                           cu_q_lens=np.array([0, n], np.int32), num_seqs=np.array([1], np.int32))
    kv = jnp.zeros((a.num_layers, 2, num_blocks, BLOCK, a.num_kv_heads, a.head_dim))
    cpu = backend_for("cpu")
    hidden, _ = model(jnp.asarray(token_ids), kv, md, cpu.attention(), layer_loop or cpu.layer_loop)
    return np.asarray(model.compute_logits(hidden))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer (its first 256 ids are the
    vocabulary; tests prompt it with token ids)."""
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(path)
    load_tokenizer(default_model_path()).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hf_default_model():
    """transformers' own GGUF loading of the default model in float32 (needs torch, which only
    the test extra installs): loaded once for the loader's tests and the default model's."""
    torch = pytest.importorskip("torch")
    import transformers

    from jaxvllm.transformers_utils.model_path import default_model_path

    directory, name = os.path.split(default_model_path())
    return transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()


@pytest.fixture
def fresh_executables(tmp_path, monkeypatch):
    """An empty directory for the step programs warm-up saves, so that a test counting
    compilations does not load programs an earlier test saved for the same shapes."""
    path = tmp_path / "executables"
    monkeypatch.setattr("jaxvllm.worker.model_runner.executables_dir", lambda: str(path))
    return path


MOE_FAMILIES = {  # architecture prefix -> its config's expert fields
    "Mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "Qwen3Moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
                     head_dim=32),
    "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                     shared_expert_intermediate_size=80),
}


def write_tiny_moe(path, arch: str, *, seed=0, **extra):
    """A random mixture-of-experts checkpoint written by transformers (from_config, weights
    redrawn at a scale where routing and greedy choices are far from ties) and its config."""
    import torch
    import transformers

    cfg = getattr(transformers, f"{arch}Config")(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=2, bos_token_id=1,
        tie_word_embeddings=False, **{**MOE_FAMILIES[arch], **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{arch}ForCausalLM")._from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if "embed" in name else 0.3 if "lm_head" in name else 0.1 if "norm" in name else 0.08
            p.copy_(torch.randn_like(p) * scale + (1.0 if "norm" in name else 0.0))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return cfg

