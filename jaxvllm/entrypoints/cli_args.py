"""The command line's argument parsing, shared by `jaxvllm` (cli.py) and `python -m
jaxvllm.entrypoints.openai.api_server` (vLLM's spelling of `jaxvllm serve`).

Engine flags are spelled as vLLM spells them (--max-model-len, --max-num-seqs, ...);
they are generated from EngineArgs so the two can never drift apart.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import sys

from jaxvllm import vllm_compat
from jaxvllm.config import EngineArgs, attribute_docs
from jaxvllm.entrypoints.openai.server_args import ServerArgs


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


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
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


def engine_args(ns: argparse.Namespace) -> EngineArgs:
    vllm_compat.check_cli_args(ns)
    given = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)
             if f.name != "seed" and getattr(ns, f.name) is not None}
    if ns.config:
        return EngineArgs.from_file(ns.config, **given)
    return EngineArgs(**given)


def add_serve_args(serve: argparse.ArgumentParser) -> None:
    """`jaxvllm serve`'s arguments."""
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
    add_engine_flags(serve)


def configure_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jaxvllm").setLevel(logging.INFO)


def exit_now(code: int):
    """Everything is stopped and flushed: skip the interpreter's teardown of torch and
    transformers (a second or more), so that a stop is as quick as it says."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
