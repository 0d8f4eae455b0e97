"""KV connectors (vLLM's kv_transfer): KV moved between the device pool and somewhere else
(host memory, another engine), chosen by `kv_transfer_config`."""
