"""msgpack encoding of the dataclasses that cross a process boundary (front end and engine,
engine and workers, hosts), with no pickle anywhere. A leaf module, as vLLM's
`vllm/v1/serial_utils.py`, so that the executor need not import the engine.

A dataclass travels as a map of its fields; decoding is driven by the receiver's
type annotations (`decode(EngineCoreOutputs, data)`), so a message can only ever
become the type the receiver asked for, never an arbitrary object.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing

import msgpack


def _to_builtin(obj):
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_builtin(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_to_builtin(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_builtin(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return [_to_builtin(x) for x in obj]
    return obj


def encode(obj) -> bytes:
    return msgpack.packb(_to_builtin(obj), use_bin_type=True)


def decode(cls, data: bytes):
    return _from_builtin(cls, msgpack.unpackb(data, raw=False, strict_map_key=False))


def convert(cls, value):
    """decode's conversion for a value msgpack has already unpacked (a field typed Any, whose
    receiver knows its type: a KV connector's metadata)."""
    return _from_builtin(cls, value)


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _from_builtin(tp, value):
    if value is None or tp is typing.Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        for a in args:  # the first structured alternative that fits
            if (dataclasses.is_dataclass(a) and isinstance(value, dict)) or \
               (typing.get_origin(a) in (list, tuple, set, frozenset) and isinstance(value, list)) or \
               (typing.get_origin(a) is dict and isinstance(value, dict)) or \
               (isinstance(a, type) and issubclass(a, enum.Enum) and isinstance(value, int)):
                return _from_builtin(a, value)
        return value
    if origin in (list, set, frozenset):
        (item,) = typing.get_args(tp) or (typing.Any,)
        return origin(_from_builtin(item, v) for v in value)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_builtin(args[0], v) for v in value)
        return tuple(_from_builtin(a, v) for a, v in zip(args, value))
    if origin is dict:
        kt, vt = typing.get_args(tp) or (typing.Any, typing.Any)
        return {_from_builtin(kt, k): _from_builtin(vt, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"Expected a map for {tp.__name__}, got {type(value).__name__}.")
        hints = _hints(tp)
        kwargs = {name: _from_builtin(hints[name], v) for name, v in value.items() if name in hints}
        init = {f.name for f in dataclasses.fields(tp) if f.init}
        obj = tp(**{k: v for k, v in kwargs.items() if k in init})
        for k, v in kwargs.items():  # fields outside __init__ (derived state) as sent
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    return value
