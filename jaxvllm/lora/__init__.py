"""LoRA adapters (vLLM's vllm/lora): the request that names one, and reading PEFT's files.
Host only: nothing here imports jax (the device side is jaxvllm/layers/lora.py and
jaxvllm/worker/lora_manager.py)."""
