"""Model shapes known by name, for plans and benchmarks built from shapes alone (zero or
abstract weights, nothing downloaded): the default model, Llama-3-8B, Gemma 3 (270M, 27B: five
sliding-window layers to one global) and a tiny one."""
from __future__ import annotations

from jaxvllm.models.gemma import GemmaArgs
from jaxvllm.models.llama import LlamaArgs

SMOLLM2 = LlamaArgs(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                    num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                    rope_scaling=None, tie_word_embeddings=True, attention_bias=False,
                    max_position_embeddings=8192)
LLAMA3_8B = LlamaArgs(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                      num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling=None, tie_word_embeddings=False, attention_bias=False,
                      max_position_embeddings=8192)
TINY = LlamaArgs(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                 tie_word_embeddings=True, attention_bias=False, max_position_embeddings=512)

GEMMA3_270M = GemmaArgs(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4,
                        num_kv_heads=1, head_dim=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
                        rope_scaling=None, tie_word_embeddings=True, attention_bias=False,
                        max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256.0,
                        sliding_layers=tuple(i % 6 != 5 for i in range(18)), local_rope_theta=10000.0,
                        qk_norm=True)
GEMMA3_27B = GemmaArgs(vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_layers=62, num_heads=32,
                       num_kv_heads=16, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       rope_scaling=(("factor", 8.0), ("rope_type", "linear")), tie_word_embeddings=True,
                       attention_bias=False, max_position_embeddings=131072, sliding_window=1024,
                       query_pre_attn_scalar=168.0, sliding_layers=tuple(i % 6 != 5 for i in range(62)),
                       local_rope_theta=10000.0, qk_norm=True)

SHAPES = {"smollm2": SMOLLM2, "llama3-8b": LLAMA3_8B, "gemma3-270m": GEMMA3_270M, "gemma3-27b": GEMMA3_27B}
