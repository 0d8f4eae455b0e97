"""One object per device kind holds what differs by device; the engine's defaults follow it."""
from __future__ import annotations

import types

import jax
import pytest

from jaxvllm import platforms
from jaxvllm.config import EngineArgs
from jaxvllm.platforms import get_platform


def test_current_platform_is_chosen_from_the_default_backend():
    assert platforms.current_platform is get_platform(jax.default_backend())
    assert get_platform("gpu") is get_platform("cuda")
    with pytest.raises(ValueError, match="No jaxvllm platform"):
        get_platform("metal")


@pytest.mark.parametrize("name,dtype,block_size,branches", [
    ("cpu", "float32", 16, True),
    ("cuda", "bfloat16", 16, False),
    ("tpu", "bfloat16", 32, False),
])
def test_engine_defaults_follow_the_platform(name, dtype, block_size, branches):
    platform = get_platform(name)
    config = EngineArgs().create_engine_config(types.SimpleNamespace(max_position_embeddings=8192), name)
    assert (config.dtype, config.cache.block_size) == (dtype, block_size)
    assert config.scheduler.max_model_len == (2048 if name == "cpu" else 8192)
    assert platform.step_may_branch is branches
    assert platform.huge_pages is platform.serialize_executables is (name == "cpu")


def test_device_memory_from_the_backend_or_none():
    full = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": 100, "bytes_in_use": 7})
    silent = types.SimpleNamespace(memory_stats=lambda: None)
    assert get_platform("tpu").device_memory(full) == (100, 7)
    assert get_platform("cpu").device_memory(silent) is None
