"""The EngineConfig in sections: EngineArgs resolve into them, the config crosses processes
as msgpack without the Hugging Face config (each process reads it from the checkpoint's
path), and a bad value is refused naming its field."""
from __future__ import annotations

import dataclasses

import pytest

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.serial_utils import decode, encode
from jaxvllm.transformers_utils.config import load_hf_config


def test_sections_cross_processes_and_the_hf_config_is_read_where_they_land(tiny_model_dir):
    hf_config = load_hf_config(str(tiny_model_dir))
    config = EngineArgs(model=str(tiny_model_dir), quantization="int8", kv_cache_dtype="int8", seed=3,
                        max_num_seqs=4, skip_warmup=True).create_engine_config(hf_config, "cpu")
    assert config.model.hf_config is hf_config and config.model.path == str(tiny_model_dir)
    assert (config.quantization, config.cache.kv_cache_dtype, config.model.seed) == ("int8", "int8", 3)
    assert config.scheduler.max_num_seqs == 4 and config.compilation.skip_warmup
    received = decode(EngineConfig, encode(config))
    assert received == config and "hf_config" not in received.model.__dict__
    assert received.model.hf_config.to_dict() == hf_config.to_dict()


def test_a_bad_section_value_names_its_field(tiny_model_dir):
    hf_config = load_hf_config(str(tiny_model_dir))
    config = EngineArgs(model=str(tiny_model_dir)).create_engine_config(hf_config, "cpu")
    bad = config.replace(cache=dataclasses.replace(config.cache, kv_cache_dtype="int4"))
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        bad.verify()
    with pytest.raises(ValueError, match="async_scheduling needs distributed_executor_backend='uni'"):
        EngineArgs(model=str(tiny_model_dir), distributed_executor_backend="mp",
                   async_scheduling=True).create_engine_config(hf_config, "cpu")
    with pytest.raises(ValueError, match="enable_lora does not combine with speculative_config"):
        EngineArgs(model=str(tiny_model_dir), enable_lora=True, speculative_config={
            "method": "ngram", "num_speculative_tokens": 2}).create_engine_config(hf_config, "cpu")
