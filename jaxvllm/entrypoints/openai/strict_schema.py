"""OpenAI's `strict` (on a function tool, on response_format's json_schema, on Responses'
text.format): the reply holds exactly the keys the schema declares, every object closed
(`additionalProperties: false`) and every property required.

Objects that do not say so are closed and made to require all their properties here (what
OpenAI's SDKs write into a schema before they send it with `strict`). What strict mode cannot
keep that promise for is refused with a ValueError naming the keyword and where it is, the
keywords OpenAI's strict mode refuses: an object left open (`additionalProperties` true or a
schema), keys by pattern or by count, conditions and intersections. Never loosened.
vLLM 0.32 accepts `strict` and ignores it.
"""
from __future__ import annotations

from jaxvllm.core.json_schema import copy_schema, walk

UNSUPPORTED = ("allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
               "patternProperties", "unevaluatedProperties", "propertyNames", "minProperties",
               "maxProperties", "unevaluatedItems", "contains", "minContains", "maxContains", "uniqueItems")


def _is_object(node: dict) -> bool:
    kind = node.get("type")
    return "properties" in node or kind == "object" or (isinstance(kind, list) and "object" in kind)


def strict_schema(schema, field: str) -> dict:
    """The schema as strict mode compiles it; ValueError starting with `field` otherwise."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError(f"{field}: strict mode needs a schema of type object at the root.")
    schema = copy_schema(schema)
    for path, node in walk(schema):
        where = f"at {path}" if path else "at the root"
        keyword = next((k for k in UNSUPPORTED if k in node), None)
        if keyword is not None:
            raise ValueError(f"{field}: strict mode does not support '{keyword}' ({where}); remove it or "
                             f"set strict to false.")
        if not _is_object(node):
            continue
        if node.get("additionalProperties", False) is not False:
            raise ValueError(f"{field}: strict mode needs 'additionalProperties' to be false ({where}): "
                             f"every object is closed; set strict to false for an open one.")
        properties = node.get("properties", {})
        undeclared = [k for k in node.get("required", ()) if k not in properties]
        if undeclared:
            raise ValueError(f"{field}: 'required' names {undeclared[0]!r}, which 'properties' does not "
                             f"declare ({where}); strict mode closes every object.")
        node["additionalProperties"] = False
        node["required"] = list(properties)
    return schema
