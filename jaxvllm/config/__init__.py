"""Engine configuration: what a user sets (EngineArgs) and what the engine runs with
(EngineConfig and its parts)."""
from jaxvllm.config.engine_args import EngineArgs, attribute_docs
from jaxvllm.config.engine_config import (KV_CACHE_DTYPES, QUANTIZATIONS, CacheConfig, EngineConfig,
                                          ParallelConfig, SchedulerConfig)

__all__ = ["EngineArgs", "attribute_docs", "EngineConfig", "CacheConfig", "SchedulerConfig",
           "ParallelConfig", "QUANTIZATIONS", "KV_CACHE_DTYPES"]
