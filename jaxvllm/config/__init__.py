"""Engine configuration: what a user sets (EngineArgs) and what the engine runs with
(EngineConfig, in sections)."""
from jaxvllm.config.engine_args import EngineArgs, attribute_docs
from jaxvllm.config.engine_config import (
                                          CacheConfig,
                                          CompilationConfig,
                                          EngineConfig,
                                          LoadConfig,
                                          LoRAConfig,
                                          ModelConfig,
                                          ParallelConfig,
                                          QuantizationConfig,
                                          SchedulerConfig,
)
from jaxvllm.config.kv_transfer import KVTransferConfig
from jaxvllm.config.pooler import PoolerConfig
from jaxvllm.config.speculative import SpeculativeConfig
from jaxvllm.config.verify import KV_CACHE_DTYPES, QUANTIZATIONS

__all__ = ["EngineArgs", "attribute_docs", "EngineConfig", "ModelConfig", "PoolerConfig", "CacheConfig",
           "SchedulerConfig", "ParallelConfig", "LoadConfig", "LoRAConfig", "QuantizationConfig", "CompilationConfig",
           "SpeculativeConfig", "KVTransferConfig", "QUANTIZATIONS", "KV_CACHE_DTYPES"]
