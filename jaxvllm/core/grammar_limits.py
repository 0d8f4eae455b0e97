"""Bounds a grammar must keep before llguidance compiles it.

llguidance's compiler recurses natively over a schema's references and nesting: a chain
of a few thousand `$ref`s overflows the thread's stack and kills the process, and a regex
whose counted repetitions multiply out (`c{1000}{1000}`) makes its lexer spend seconds per
token before giving up. So the schema is walked here first, iteratively, following local
references, and refused (ValueError naming the limit) past:
- MAX_SCHEMA_DEPTH nested subschemas along any path, `$ref` hops included (a reference
  cycle counts as deep as the path walked before it closes),
- MAX_SCHEMA_NODES distinct subschemas and MAX_ENUM_VALUES enum/const values in all,
- MAX_REGEX_SIZE for a regex expanded the way a lexer sees it (counted repetitions
  multiplied out, alternatives added up), per `pattern` or `regex`.
The depth bound keeps well clear of where the compiler's recursion overflows an 8 MiB
stack (about 900 levels of nested objects).

A grammar that compiles may still make each next-token mask slow to compute (many regexes
alive at once, whose lexer states are built as the reply goes), and masks are computed in
the engine's busy loop, for every request in the batch. So each request's mask work is
bounded twice (core/structured_output.py): per step by llguidance's own limits (MASK_LIMITS:
lexer fuel, Earley items, lexer states; deterministic), and in CPU time by a budget that
starts at MASK_BUDGET_S and grows by MASK_REFILL_S per sampled token. Past either the
request ends with an error naming the budget, and the batch goes on.
"""
from __future__ import annotations

import json
import re
import re._parser as sre_parse

from jaxvllm.core.json_schema import SUBSCHEMA, SUBSCHEMA_LISTS, SUBSCHEMA_MAPS

MAX_SCHEMA_DEPTH = 128
MAX_SCHEMA_NODES = 20_000
MAX_ENUM_VALUES = 10_000
MAX_REGEX_SIZE = 10_000
MAX_GRAMMAR_CHARS = 200_000
MASK_LIMITS = {"step_lexer_fuel": 50_000, "step_max_items": 50_000, "max_lexer_states": 50_000}
MASK_BUDGET_S = 0.1
MASK_REFILL_S = 0.002



def check_grammar_limits(field: str, kind: str, value) -> None:
    """ValueError if the grammar of this kind (json, regex, choice, grammar) is past a limit."""
    if kind == "json":
        if isinstance(value, str):
            if len(value) > MAX_GRAMMAR_CHARS:
                raise ValueError(f"{field} is longer than {MAX_GRAMMAR_CHARS} characters.")
            try:
                value = json.loads(value)
            except ValueError:
                return  # not JSON: llguidance names the problem
        check_schema(field, value)
    elif kind == "regex":
        check_regex(field, value)
    elif kind == "choice":
        if sum(len(c) for c in value) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"{field} holds more than {MAX_GRAMMAR_CHARS} characters in all.")
    elif kind == "grammar" and len(value) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"{field} is longer than {MAX_GRAMMAR_CHARS} characters.")


def check_schema(field: str, root) -> None:
    """Walks every subschema reachable from the root (local `$ref`s followed) once,
    depth-first with an explicit stack, memoizing each subschema's depth."""
    depth_of: dict[int, int] = {}
    on_path: set[int] = set()
    counts = {"nodes": 0, "enum": 0}
    stack = [[root, _children(field, root, root, counts), 0]]  # node, children, deepest child
    on_path.add(id(root))
    while stack:
        frame = stack[-1]
        child = next(frame[1], None)
        if child is None:
            stack.pop()
            on_path.discard(id(frame[0]))
            depth_of[id(frame[0])] = frame[2] + 1
            if stack:
                stack[-1][2] = max(stack[-1][2], frame[2] + 1)
            continue
        key = id(child)
        if key in on_path:
            continue  # a recursive schema: its depth is what the path walked
        below = depth_of.get(key)
        if below is None:
            if len(stack) + 1 > MAX_SCHEMA_DEPTH:
                raise ValueError(f"{field} nests subschemas (counting $ref hops) deeper than "
                                 f"{MAX_SCHEMA_DEPTH} levels.")
            on_path.add(key)
            stack.append([child, _children(field, child, root, counts), 0])
            continue
        if len(stack) + below > MAX_SCHEMA_DEPTH:
            raise ValueError(f"{field} nests subschemas (counting $ref hops) deeper than "
                             f"{MAX_SCHEMA_DEPTH} levels.")
        frame[2] = max(frame[2], below)


def _children(field: str, node, root, counts):
    """The subschemas of one node (after checking the node itself), as an iterator."""
    counts["nodes"] += 1
    if counts["nodes"] > MAX_SCHEMA_NODES:
        raise ValueError(f"{field} has more than {MAX_SCHEMA_NODES} subschemas.")
    if not isinstance(node, dict):
        return iter(())
    for key in ("enum", "const"):
        if key in node:
            counts["enum"] += len(node[key]) if key == "enum" and isinstance(node[key], list) else 1
            if counts["enum"] > MAX_ENUM_VALUES:
                raise ValueError(f"{field} lists more than {MAX_ENUM_VALUES} enum/const values.")
    if isinstance(node.get("pattern"), str):
        check_regex(f"{field} pattern", node["pattern"])
    subs = []
    for key in SUBSCHEMA:
        if isinstance(node.get(key), dict):
            subs.append(node[key])
    for key in SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            subs.extend(s for s in node[key] if isinstance(s, dict))
    for key in SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            if key == "patternProperties":
                for pattern in node[key]:
                    check_regex(f"{field} patternProperties", pattern)
            subs.extend(s for s in node[key].values() if isinstance(s, dict))
    target = _resolve(node.get("$ref"), root)
    if target is not None:
        subs.append(target)
    return iter(subs)


def _resolve(ref, root):
    """The subschema a local reference ("#", "#/$defs/x") names, else None."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict) else None


def check_regex(field: str, pattern: str) -> None:
    """ValueError if the regex expands past MAX_REGEX_SIZE. Python's parser reads it; for
    a regex it cannot read (llguidance also takes `a{2}{3}`, which Python refuses), every
    counted repetition in it is taken to apply to the whole pattern: an upper bound."""
    if len(pattern) > MAX_REGEX_SIZE:
        raise ValueError(f"{field} is longer than {MAX_REGEX_SIZE} characters.")
    try:
        size = _regex_size(sre_parse.parse(pattern))
    except (re.error, RecursionError, OverflowError):
        size = len(pattern)
        for low, high in re.findall(r"\{(\d+)(?:,(\d*))?\}", pattern):
            size *= max(int(high or low), 1)
            if size > MAX_REGEX_SIZE:
                break
    if size > MAX_REGEX_SIZE:
        raise ValueError(f"{field} expands past {MAX_REGEX_SIZE} states (counted repetitions "
                         f"multiply, alternatives add up); simplify the regex.")


def _regex_size(items) -> int:
    size = 0
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            times = high if high != sre_parse.MAXREPEAT else max(low, 1)
            size += _regex_size(sub) * max(times, 1)
        elif name == "BRANCH":
            size += sum(_regex_size(b) for b in arg[1])
        elif name == "SUBPATTERN":
            size += _regex_size(arg[-1])
        elif name in ("ASSERT", "ASSERT_NOT"):
            size += _regex_size(arg[1])
        else:
            size += 1
        if size > MAX_REGEX_SIZE:
            return size
    return size
