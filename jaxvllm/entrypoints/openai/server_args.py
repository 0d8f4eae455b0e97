"""The limits and switches of `jaxvllm serve` that are not engine arguments: who may call
it, how much one request may ask for, and how many connections it holds. Defaults are
what a deployment open to untrusted clients should start from (vLLM's names where vLLM
has the flag)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from jaxvllm.lora.request import LoRARequest


@dataclass
class ServerArgs:
    api_key: str | None = None
    # Larger bodies are refused with 413 before they are read.
    max_request_bytes: int = 8 << 20
    # Samples per prompt and prompts per request: one request cannot fill the engine.
    max_n: int = 128
    max_prompts_per_request: int = 256
    # Connections held at once; past it uvicorn answers 503.
    max_concurrent_connections: int = 1024
    # A connection that has not sent a whole request head in this time is closed.
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: int = 5
    # Client-supplied chat templates run only with this flag, in a sandboxed process
    # with a time and output-size limit.
    trust_request_chat_template: bool = False
    chat_template_timeout_s: float = 2.0
    disable_fastapi_docs: bool = False
    # On SIGINT/SIGTERM, requests in flight get this long to finish before they are ended.
    shutdown_timeout_s: float = 30.0
    # /sleep, /wake_up, /is_sleeping, /reset_prefix_cache and /update_weights (sleep_routes.py).
    enable_sleep_mode: bool = False
    # Agents (vLLM's flags): a chat template for every request, tool calls read from the
    # text by a named parser when tool_choice is "auto", reasoning split from the answer,
    # and how many /v1/responses replies are kept for previous_response_id.
    chat_template: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    tool_parser_plugin: str | None = None
    reasoning_parser: str | None = None
    max_stored_responses: int = 1024
    # LoRA adapters served as models of their own (--lora-modules name=path; --enable-lora).
    lora_modules: tuple[str, ...] = ()
    # /v1/load_lora_adapter and /v1/unload_lora_adapter, loading from these roots only.
    allow_runtime_lora_updating: bool = False
    lora_dirs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.lora_requests()  # a malformed --lora-modules fails at start
        for name in ("max_request_bytes", "max_n", "max_prompts_per_request",
                     "max_concurrent_connections", "keep_alive_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("header_timeout_s", "chat_template_timeout_s", "shutdown_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        self._check_agent_args()

    def _check_agent_args(self) -> None:
        from jaxvllm.entrypoints.openai.reasoning import ReasoningParserManager
        from jaxvllm.entrypoints.openai.tool_parsers import ToolParserManager
        if self.tool_parser_plugin:
            ToolParserManager.import_tool_parser(self.tool_parser_plugin)
        if self.tool_call_parser:
            ToolParserManager.get_tool_parser(self.tool_call_parser)
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME.")
        if self.reasoning_parser:
            ReasoningParserManager.get_reasoning_parser(self.reasoning_parser)
        if self.max_stored_responses < 0:
            raise ValueError(f"max_stored_responses must be at least 0, got {self.max_stored_responses}.")

    def lora_requests(self) -> dict[str, LoRARequest]:
        """The --lora-modules by name, numbered from 1 in the order given."""
        out = {}
        for i, module in enumerate(self.lora_modules, 1):
            name, sep, path = module.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules takes name=path, got {module!r}.")
            if name in out:
                raise ValueError(f"--lora-modules names {name!r} twice.")
            out[name] = LoRARequest(name, i, path)
        return out

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        d = ServerArgs()
        parser.add_argument("--api-key", default=os.environ.get("JAXVLLM_API_KEY"),
                            help="Require 'Authorization: Bearer KEY' on every endpoint but "
                                 "/health, /version and /metrics (default: $JAXVLLM_API_KEY).")
        parser.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes,
                            help="Larger request bodies get 413 (default: %(default)s).")
        parser.add_argument("--max-n", type=int, default=d.max_n,
                            help="Most samples per prompt, `n` (default: %(default)s).")
        parser.add_argument("--max-prompts-per-request", type=int,
                            default=d.max_prompts_per_request,
                            help="Most prompts in one completions request (default: %(default)s).")
        parser.add_argument("--max-concurrent-connections", type=int,
                            default=d.max_concurrent_connections,
                            help="Connections held at once; more get 503 (default: %(default)s).")
        parser.add_argument("--header-timeout", dest="header_timeout_s", type=float,
                            default=d.header_timeout_s,
                            help="Seconds a connection may take to send a request head "
                                 "(default: %(default)s).")
        parser.add_argument("--keep-alive-timeout", dest="keep_alive_timeout_s", type=int,
                            default=d.keep_alive_timeout_s,
                            help="Seconds an idle keep-alive connection stays open "
                                 "(default: %(default)s).")
        parser.add_argument("--trust-request-chat-template", action="store_true",
                            help="Let requests bring their own chat template "
                                 "(chat_template_kwargs.chat_template), rendered in a sandbox.")
        parser.add_argument("--chat-template-timeout", dest="chat_template_timeout_s", type=float,
                            default=d.chat_template_timeout_s,
                            help="Seconds a request's own chat template may render "
                                 "(default: %(default)s).")
        parser.add_argument("--disable-fastapi-docs", action="store_true",
                            help="Serve no /docs, /redoc or /openapi.json.")
        parser.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=float,
                            default=d.shutdown_timeout_s,
                            help="On SIGINT/SIGTERM, seconds requests in flight get to finish "
                                 "(default: %(default)s).")

        parser.add_argument("--enable-sleep-mode", action="store_true",
                            help="Serve POST /sleep, /wake_up, /reset_prefix_cache, /update_weights "
                                 "and GET /is_sleeping (vLLM's), for RL trainers and schedulers.")
        parser.add_argument("--lora-modules", nargs="+", default=(), metavar="NAME=PATH",
                            help="LoRA adapters (PEFT directories) served beside the base model, "
                                 "each chosen by a request's `model` (needs --enable-lora).")
        parser.add_argument("--allow-runtime-lora-updating", action="store_true",
                            default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower()
                            in ("1", "true"),
                            help="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                                 "(default: $VLLM_ALLOW_RUNTIME_LORA_UPDATING).")
        parser.add_argument("--lora-dir", dest="lora_dirs", nargs="+", default=(), metavar="DIR",
                            help="Directories /v1/load_lora_adapter may load adapters from "
                                 "(none: it loads nothing).")
        agents = parser.add_argument_group("Tool calling, reasoning and the Responses API")
        agents.add_argument("--chat-template", default=None,
                            help="A Jinja chat template (a file, or the template itself) used "
                                 "instead of the model's.")
        agents.add_argument("--enable-auto-tool-choice", action="store_true",
                            help='Let the model decide to call tools (tool_choice "auto"); '
                                 "needs --tool-call-parser.")
        agents.add_argument("--tool-call-parser", default=None,
                            help="How tool calls are read from the model's text: hermes, "
                                 "llama3_json, mistral, pythonic, qwen3_coder, or a plugin's name.")
        agents.add_argument("--tool-parser-plugin", default=None,
                            help="A Python file that registers more tool parsers "
                                 "(@ToolParserManager.register_module).")
        agents.add_argument("--reasoning-parser", default=None,
                            help="Split <think>...</think> into reasoning_content: deepseek_r1, qwen3.")
        agents.add_argument("--max-stored-responses", type=int, default=d.max_stored_responses,
                            help="/v1/responses replies kept in memory for previous_response_id; "
                                 "the oldest go first (default: %(default)s).")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "ServerArgs":
        return cls(**{name: tuple(getattr(ns, name)) if name in ("lora_modules", "lora_dirs")
                      else getattr(ns, name) for name in cls.__dataclass_fields__})
