"""`jaxvllm generate` and `jaxvllm chat`: offline generation from the command line;
`jaxvllm serve`: the OpenAI-compatible HTTP server (entrypoints/openai/api_server.py);
`jaxvllm convert`: a model to an Orbax checkpoint; `jaxvllm compile`: every program compiled
for a TPU slice (entrypoints/compile.py). Their flags: cli_args.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from jaxvllm import vllm_compat
from jaxvllm.entrypoints import compile as compile_cli
from jaxvllm.entrypoints import disagg_proxy
from jaxvllm.entrypoints.cli_args import (
    ArgumentParser,
    add_engine_flags,
    add_serve_args,
    configure_logging,
    engine_args,
    exit_now,
)
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.version import __version__


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="Sampling seed of each request.")


def _add_serve_parser(sub) -> None:
    add_serve_args(sub.add_parser("serve", help="OpenAI-compatible HTTP server."))


class _ListModels(argparse.Action):
    """--list-models: the architectures the model registry serves, then exit (as --version)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from jaxvllm.models.registry import supported_architectures  # imports JAX: only when asked
        print("\n".join(supported_architectures()))
        parser.exit()


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="jaxvllm")
    parser.add_argument("--version", action="version", version=f"jaxvllm {__version__}")
    parser.add_argument("--list-models", action=_ListModels,
                        help="Print the supported model architectures (config.json's `architectures`) and exit.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="Complete one or more prompts.")
    gen.add_argument("prompts", nargs="+")
    gen.add_argument("--chat", action="store_true", help="Wrap each prompt in the chat template.")
    chat = sub.add_parser("chat", help="One chat turn.")
    chat.add_argument("message")
    chat.add_argument("--system", default=None)
    for p in (gen, chat):
        p.add_argument("--chat-template", default=None,
                       help="A Jinja chat template, or a file holding one, in place of the model's.")
        add_engine_flags(p)
        _add_sampling_flags(p)
    _add_serve_parser(sub)
    conv = sub.add_parser("convert", help="Save a model's weights as an Orbax checkpoint.")
    conv.add_argument("model", help="A .gguf file or Hugging Face directory; 'default' for the default model.")
    conv.add_argument("out", help="New directory: Orbax weights + config + tokenizer, a model path.")
    conv.add_argument("--dtype", default="auto")
    conv.add_argument("--tensor-parallel-size", type=int, default=1)
    compile_cli.add_parser(sub, add_engine_flags)
    disagg_proxy.add_parser(sub)
    for sub_parser in sub.choices.values():  # which parser's flags to suggest from
        sub_parser.set_defaults(_subparser=sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    configure_logging()
    if ns.command == "serve":
        from jaxvllm.entrypoints.openai.api_server import run_server
        exit_now(run_server(ns))
    if ns.command == "disagg-proxy":
        return disagg_proxy.run(ns)
    if ns.command == "compile":
        vllm_compat.check_cli_args(ns)
        return compile_cli.run(ns)
    if ns.command == "convert":
        from jaxvllm.entrypoints.convert import convert
        try:
            convert(None if ns.model == "default" else ns.model, ns.out, ns.dtype, ns.tensor_parallel_size)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0

    from jaxvllm.entrypoints.llm import LLM  # after parsing: --help stays instant
    try:
        params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p,
                                top_k=ns.top_k, seed=ns.seed)
        llm = LLM(**dataclasses.asdict(engine_args(ns)))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if ns.command == "chat":
            conv = ([{"role": "system", "content": ns.system}] if ns.system else [])
            outputs = llm.chat(conv + [{"role": "user", "content": ns.message}], params,
                               chat_template=ns.chat_template)
            print(outputs[0].outputs[0].text)
            return 0
        if ns.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in ns.prompts], params,
                               chat_template=ns.chat_template)
        else:
            outputs = llm.generate(ns.prompts, params)
    except ValueError as e:  # a prompt the model cannot take
        print(f"error: {e}", file=sys.stderr)
        return 2
    for prompt, out in zip(ns.prompts, outputs):
        print(f"\n### Prompt: {prompt}\n### Completion: {out.outputs[0].text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
