"""A mixture-of-experts model's engine step lowered for a TPU and an NVIDIA GPU on this CPU
(benchmarks/lower_step.py): the experts run as the platform's grouped matmul (megablox `gmm`
kernels on a TPU, `ragged_dot` on a GPU) inside a step with no conditional, the KV cache
updated in place."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.lower_step import lower_step, program_rows  # noqa: E402
from jaxvllm.models.mixtral import MoeArgs  # noqa: E402
from jaxvllm.models.qwen3_moe import Qwen3MoeForCausalLM  # noqa: E402

ARGS = MoeArgs(vocab_size=256, hidden_size=256, intermediate_size=0, num_layers=2, num_heads=4, num_kv_heads=2,
               head_dim=64, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None, tie_word_embeddings=False,
               attention_bias=False, max_position_embeddings=512, num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=128)


def loop_owners(text: str) -> set[str]:
    """The private functions whose bodies hold a `stablehlo.while`."""
    bodies = re.findall(r"func\.func \w+ @([\w$.]+)\((.*?)(?=\n  func\.func |\Z)", text, re.S)
    return {name for name, body in bodies if "stablehlo.while" in body}


@pytest.mark.parametrize("platform, kernels_per_layer", [("tpu", 3), ("cuda", 1)])
def test_moe_step_lowers_with_the_platforms_grouped_matmul(platform, kernels_per_layer):
    texts, kv_cache = lower_step(platform, ARGS, model_cls=Qwen3MoeForCausalLM)
    forward = program_rows(platform, {"forward": texts["forward"]}, kv_cache)[0]
    # TPU: attention and two gmm calls (gate/up, down) per layer; GPU: attention only.
    assert (forward["case"], forward["kernels"], forward["kv_donated"]) == (0, kernels_per_layer * ARGS.num_layers,
                                                                            True)
    if platform == "tpu":
        # megablox's own group metadata (jnp.histogram's searchsorted over the row tiles) is
        # the one loop: no layer or expert loop.
        assert {name.rstrip("_0123456789") for name in loop_owners(texts["forward"])} == {"_searchsorted_scan_impl"}
    else:
        assert forward["loops"] == 0 and "ragged_dot" in texts["forward"]
