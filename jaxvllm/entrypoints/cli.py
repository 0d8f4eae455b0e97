"""`jaxvllm generate` and `jaxvllm chat`: offline generation from the command line;
`jaxvllm serve`: the OpenAI-compatible HTTP server; `jaxvllm convert`: a model to an Orbax
checkpoint; `jaxvllm compile`: every program compiled for a TPU slice (entrypoints/compile.py).

Engine flags are spelled as vLLM spells them (--max-model-len, --max-num-seqs, ...);
they are generated from EngineArgs so the two can never drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import signal
import sys

import jaxvllm
from jaxvllm import vllm_compat
from jaxvllm.config import EngineArgs, attribute_docs
from jaxvllm.entrypoints import compile as compile_cli
from jaxvllm.entrypoints import disagg_proxy
from jaxvllm.entrypoints.openai.server_args import ServerArgs
from jaxvllm.sampling_params import SamplingParams


class ArgumentParser(argparse.ArgumentParser):
    """No prefix matching (`--chat-template` is never read as `--chat-template-timeout`), and
    a mistake costs one line naming the nearest real flag instead of the whole usage block.
    Subcommand parsers are of this class too (argparse builds them with the parent's)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        flags = [a for a in extras if a.startswith("-")]
        if flags and "_subparser" in vars(ns):  # a subcommand's unknown flag: its own options
            self._suggest(flags[0], ns._subparser)
        return ns, extras

    def _suggest(self, flag: str, parser: argparse.ArgumentParser):
        known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
        near = difflib.get_close_matches(flag.split("=")[0], known, n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]}?" if near else f" (see {parser.prog} --help)"
        parser.exit(2, f"{parser.prog}: error: unrecognized argument {flag}{hint}\n")

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML preset of engine arguments (configs/*.yaml).")
    docs = attribute_docs(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        if f.name == "seed":  # --seed is the requests' sampling seed here
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type).split(" |")[0]  # annotations are strings here
        default = "" if f.default is None else f" (default: {f.default})"  # else the doc says
        help = (docs[f.name] + default).replace("%", "%%")
        if kind == "bool":
            # --enable-prefix-caching defaults to on: --no-enable-prefix-caching turns it off.
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parser.add_argument(flag, type={"int": int, "float": float}.get(kind, str), default=None,
                                help=help)
    vllm_compat.add_cli_args(parser)


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="Sampling seed of each request.")


def _engine_args(ns: argparse.Namespace) -> EngineArgs:
    vllm_compat.check_cli_args(ns)
    given = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)
             if f.name != "seed" and getattr(ns, f.name) is not None}
    if ns.config:
        return EngineArgs.from_file(ns.config, **given)
    return EngineArgs(**given)


def _add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server.")
    serve.add_argument("model_tag", nargs="?", default=None,
                       help="Model path (the default model when omitted); same as --model.")
    serve.add_argument("--host", default="127.0.0.1", help="Bind address (0.0.0.0 exposes it).")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--uvicorn-log-level", default="info")
    serve.add_argument("--seed", type=int, default=None,
                       help="Engine seed: requests without a seed draw theirs from it.")
    serve.add_argument("--served-model-name", default=None,
                       help="The model id clients send (default: a Hub id as given, else the "
                            "model's file or folder name).")
    ServerArgs.add_cli_args(serve)
    _add_engine_flags(serve)


def _serve(ns: argparse.Namespace) -> int:
    import asyncio

    from jaxvllm.entrypoints.openai.api_server import serve
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    try:
        server_args = ServerArgs.from_cli_args(ns)
        args = _engine_args(ns)
        if ns.seed is not None:
            args = dataclasses.replace(args, seed=ns.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.node_rank > 0:  # multi-host: replay node_rank 0's schedule; no HTTP server here
        from jaxvllm.distributed.multihost import run_follower
        run_follower(args)
        return 0
    # Until the server takes over its signals, both stop start-up at once (asyncio.run's
    # own Ctrl-C handler would only cancel the task, and start-up does not yield to it).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        return asyncio.run(serve(args, server_args, host=ns.host, port=ns.port,
                                 served_model_name=ns.served_model_name,
                                 log_level=ns.uvicorn_log_level))
    except (ValueError, FileNotFoundError) as e:  # a bad model or argument, found at start-up
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # stopped during start-up: the engine process is gone already
        return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


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
    parser.add_argument("--version", action="version", version=f"jaxvllm {jaxvllm.__version__}")
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
        _add_engine_flags(p)
        _add_sampling_flags(p)
    _add_serve_parser(sub)
    conv = sub.add_parser("convert", help="Save a model's weights as an Orbax checkpoint.")
    conv.add_argument("model", help="A .gguf file or Hugging Face directory; 'default' for the default model.")
    conv.add_argument("out", help="New directory: Orbax weights + config + tokenizer, a model path.")
    conv.add_argument("--dtype", default="auto")
    conv.add_argument("--tensor-parallel-size", type=int, default=1)
    compile_cli.add_parser(sub, _add_engine_flags)
    disagg_proxy.add_parser(sub)
    for name, sub_parser in sub.choices.items():  # which parser's flags to suggest from
        sub_parser.set_defaults(_subparser=sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jaxvllm").setLevel(logging.INFO)
    if ns.command == "serve":
        code = _serve(ns)
        # Everything is stopped and flushed: skip the interpreter's teardown of torch and
        # transformers (a second or more), so that a stop is as quick as it says.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
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
        llm = LLM(**dataclasses.asdict(_engine_args(ns)))
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
