"""The default model's server, shared by the default-model, tool, reasoning, Responses and
agent-framework tests of a session: SmolLM2 with small CPU settings, a Hermes-style tool
template (without tools it renders the model's own prompt), the hermes tool parser and the
qwen3 reasoning parser (which leaves replies without <think> alone)."""
from __future__ import annotations

import os

import openai
import pytest
from openai_server import API_KEY, shared_server

TEMPLATE = os.path.join(os.path.dirname(__file__), "tool_chat_template_hermes.jinja")
DEFAULT_SERVER_FLAGS = [
    "--skip-warmup", "--max-num-seqs", "8", "--max-model-len", "512",
    "--max-num-batched-tokens", "64", "--kv-cache-memory-bytes", str(128 << 20), "--api-key", API_KEY,
    "--chat-template", TEMPLATE, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--reasoning-parser", "qwen3"]
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def default_server(request):
    return shared_server(request, "default", lambda: DEFAULT_SERVER_FLAGS)


@pytest.fixture(scope="module")
def oai(default_server):
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=120)
