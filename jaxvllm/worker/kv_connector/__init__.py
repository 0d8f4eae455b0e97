"""The worker sides of the KV connectors (jaxvllm/kv_transfer holds their scheduler sides)."""
