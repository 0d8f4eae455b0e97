"""KV connectors (vLLM's kv_transfer): KV moved between the device pool and somewhere else
(host memory, another engine), chosen by `kv_transfer_config`. Here: their base, factory and
scheduler sides (host only, no JAX); their worker sides are in jaxvllm/worker/kv_connector."""
