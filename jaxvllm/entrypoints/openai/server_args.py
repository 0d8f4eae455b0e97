"""The limits and switches of `jaxvllm serve` that are not engine arguments: who may call
it, how much one request may ask for, and how many connections it holds. Defaults are
what a deployment open to untrusted clients should start from (vLLM's names where vLLM
has the flag)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


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

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_n", "max_prompts_per_request",
                     "max_concurrent_connections", "keep_alive_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("header_timeout_s", "chat_template_timeout_s", "shutdown_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")

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

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "ServerArgs":
        return cls(**{name: getattr(ns, name) for name in cls.__dataclass_fields__})
