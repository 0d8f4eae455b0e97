"""Models named by Hugging Face Hub id, as vLLM users name them: `org/name` (config,
tokenizer and safetensors weights) or `org/name/file.gguf` (one GGUF file of the repo).

huggingface_hub fetches them into its cache (or `download_dir`) with the usual HF_TOKEN and,
with HF_HUB_OFFLINE=1, finds them in that cache without the network."""
from __future__ import annotations

import re

# What loading a safetensors checkpoint reads; nothing else of the repo is fetched.
ALLOW_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                  "tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt", "*.model",
                  "chat_template.*"]
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+\.gguf)?$")


def looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name


def download_model(name: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """The local path of a Hub model (a snapshot directory, or the GGUF file). Raises
    OSError (from huggingface_hub) when it can be neither found in the cache nor fetched."""
    from huggingface_hub import hf_hub_download, snapshot_download

    parts = name.split("/")
    repo_id = "/".join(parts[:2])
    if len(parts) > 2:
        return hf_hub_download(repo_id, "/".join(parts[2:]), revision=revision, cache_dir=download_dir)
    return snapshot_download(repo_id, revision=revision, cache_dir=download_dir,
                             allow_patterns=ALLOW_PATTERNS)
