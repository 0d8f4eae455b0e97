"""The package's version (vLLM's vllm/version.py): a leaf that the CLI and the server read."""
__version__ = "0.1.0"
