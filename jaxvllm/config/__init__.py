"""Engine configuration: what a user sets (EngineArgs) and what the engine runs with
(EngineConfig, in sections)."""
from jaxvllm.config.engine_args import EngineArgs, attribute_docs
from jaxvllm.config.engine_config import (KV_CACHE_DTYPES, QUANTIZATIONS, CacheConfig, CompilationConfig,
                                          EngineConfig, LoadConfig, LoRAConfig, ModelConfig, ParallelConfig, PoolerConfig,
                                          QuantizationConfig, SchedulerConfig, SpeculativeConfig)

__all__ = ["EngineArgs", "attribute_docs", "EngineConfig", "ModelConfig", "PoolerConfig", "CacheConfig", "SchedulerConfig",
           "ParallelConfig", "LoadConfig", "LoRAConfig", "QuantizationConfig", "CompilationConfig", "SpeculativeConfig", "QUANTIZATIONS",
           "KV_CACHE_DTYPES"]
