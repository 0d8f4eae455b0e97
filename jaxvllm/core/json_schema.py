"""The defaults a JSON schema gets before llguidance compiles it, as vLLM's default grammar
backend gives them.

vLLM compiles JSON schemas with xgrammar's `strict_mode` (its default): an object that
declares `properties` (or `patternProperties`) and says nothing of `additionalProperties`
admits no other key, and an array with `prefixItems` and no `items` no other item. JSON
Schema, and llguidance with it, leaves both open, so a small model writes keys of its own
and its JSON may never end. `with_vllm_defaults` writes the two defaults into the schema.
Schemas with `allOf` are left as written there (closing each member would leave their
intersection nothing to hold; xgrammar closes their union instead).

Whitespace between JSON tokens is bounded to MAX_JSON_WHITESPACE characters (xgrammar and
llguidance allow any amount, so a model could pad until max_tokens), unless the schema's
own `x-guidance` says how; tool calls are compact (tool_choice.py).
"""
from __future__ import annotations

import json

MAX_JSON_WHITESPACE = 20  # a newline and four levels of four-space indentation, with room
JSON_WHITESPACE = {"whitespace_pattern": rf"[\x20\x0A\x0D\x09]{{0,{MAX_JSON_WHITESPACE}}}"}

# Where subschemas sit in a schema: one, a list, or a map of them.
SUBSCHEMA = ("additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
             "unevaluatedProperties", "unevaluatedItems", "additionalItems")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")
DEFINITIONS = ("$defs", "definitions")


def walk(schema: dict):
    """Every subschema (the root first) with where it is (`properties.city`), $defs
    included, without recursion: a schema may nest deeper than Python's stack."""
    stack, seen = [("", schema)], set()
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield path, node
        at = (lambda *keys, path=path: ".".join(str(k) for k in (path, *keys) if k != ""))
        for key in SUBSCHEMA:
            if isinstance(node.get(key), dict):
                stack.append((at(key), node[key]))
        for key in SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((at(key, i), sub) for i, sub in enumerate(node[key]))
        for key in SUBSCHEMA_MAPS + DEFINITIONS:
            if isinstance(node.get(key), dict):
                stack.extend((at(key, name), sub) for name, sub in node[key].items())


def copy_schema(schema: dict) -> dict:
    return json.loads(json.dumps(schema))


def with_vllm_defaults(schema):
    """A copy of the schema (a dict, or its JSON text) with vLLM's defaults; anything else
    as given, for llguidance to name what is wrong with it."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return schema
    if not isinstance(schema, dict):
        return schema
    schema = copy_schema(schema)
    nodes = list(walk(schema))
    in_all_of = {id(m) for _, node in nodes if isinstance(node.get("allOf"), list) for m in node["allOf"]}
    for _, node in nodes:
        if id(node) in in_all_of or "allOf" in node:
            continue
        if ("properties" in node or "patternProperties" in node) and "additionalProperties" not in node:
            node["additionalProperties"] = False
        if "prefixItems" in node and "items" not in node:
            node["items"] = False
    schema.setdefault("x-guidance", JSON_WHITESPACE)
    return schema
