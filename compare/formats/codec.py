"""JSON data of the project's records (frozen dataclasses), both ways, driven by their type hints. No project imports.

:func:`to_json` writes a record as its fields, in order; a nested record, a tuple (as a list) and a dict the same
way, a scalar as it is: an int in a float field stays an int, and a NaN or an infinity is left to
``json.dumps(allow_nan=True)``, which writes ``NaN`` and ``Infinity``. :func:`from_json` reads one back, checking
every value against its field's type: a missing or mistyped value is a :class:`FieldError` naming its path
(``results[3].parity.tensors[0].max_abs_err``), what was expected and what was found, never a ``KeyError`` or a
``TypeError`` from deep inside the report. Reading is as lenient as the documents' history needs:

- a field with a default takes it when absent or null (a field added later: older documents lack it); a tuple or
  dict field without one reads as empty, an optional one (``X | None``) as None;
- an int is a number, kept as an int (a document reads back and writes the same bytes); a bool is neither;
- keys that name no field are ignored (``strict=True``: refused).

What a record's layout may say beyond its fields and types, per field (``field(metadata=...)``):

- :data:`LATER`: left out of the JSON while it holds its default (a field added later leaves the documents that do
  not use it as they were); ``later(of)``: while field ``of`` holds its default;
- :data:`INLINE`: a record's fields, or a dict's items, written into the enclosing object instead of under the
  field's name (a case's shape, the ceilings' dtypes). An inline dict takes every key no other field names;

and per class:

- ``JSON_DERIVED``, a ``ClassVar`` naming properties written after the fields (a timing's ``noisy``): read back,
  a stored value must agree with the record's own;
- ``json_fill(data)``, a static method returning values for absent keys that follow from the others (a partial
  timing's ``min_s`` is its median).

A value a record's constructor refuses (a ``ValueError`` of its ``__post_init__``) is a :class:`FieldError` at the
record's path.

Why not a library: the environment has none of cattrs, dacite or pydantic, and what the records need (the exact
layout of the committed documents, their older forms, these error paths) is this one small module, no dependency.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
#: A free-form setting value (thread counts, precision flags, versions): what JSON scalars can hold.
Setting = str | int | float | bool | None


def later(of: str = "") -> Mapping[str, str]:
    """Field metadata: the field is left out of the JSON while field ``of`` (this one when not given) holds its
    default (several fields added together leave the documents that do not use them as they were)."""
    return types.MappingProxyType({"later": of})


#: Field metadata: left out of the JSON while the field holds its default.
LATER = later()
#: Field metadata: the field's record or dict is written into the enclosing object.
INLINE: Mapping[str, bool] = types.MappingProxyType({"inline": True})


class FieldError(ValueError):
    """A JSON object lacks a field, or holds one of the wrong type. ``where`` is the field's path."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


def _key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _derived(cls: Any) -> tuple[str, ...]:
    names: tuple[str, ...] = getattr(cls, "JSON_DERIVED", ())
    return names


# --- writing ---------------------------------------------------------------------------------------------------


def to_json(x: Any) -> Any:
    """JSON data of ``x``: a record (dataclass) as an object of its fields (module docstring), tuples and lists as
    lists, dicts copied, scalars as they are."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out: dict[str, Any] = {}
        fs = {f.name: f for f in dataclasses.fields(x)}
        for f in fs.values():
            v = getattr(x, f.name)
            if "later" in f.metadata:
                g = fs[f.metadata["later"] or f.name]
                if getattr(x, g.name) == _default(g):
                    continue
            if f.metadata.get("inline"):
                out.update(to_json(v))
            else:
                out[f.name] = to_json(v)
        for name in _derived(x):
            out[name] = to_json(getattr(x, name))
        return out
    if isinstance(x, list | tuple):
        return [to_json(v) for v in x]
    if isinstance(x, dict):
        return {k: to_json(v) for k, v in x.items()}
    return x


# --- reading ---------------------------------------------------------------------------------------------------


def from_json(cls: type[T], data: Any, *, strict: bool = False) -> T:
    """The record ``cls`` of JSON data ``data`` (what :func:`to_json` wrote); a :class:`FieldError` naming the path
    of the first value that does not fit. ``strict``: a key that names no field is one too."""
    out: T = _record(cls, data, "", strict)
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


#: What each scalar type takes: a bool is neither an integer nor a number; an int is a number, kept as it is.
_SCALARS: dict[Any, Callable[[Any], bool]] = {
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _kind(x: Any) -> str:
    """``x``'s type with its article: "a str", "an int", "null"."""
    if x is None:
        return "null"
    name = type(x).__name__
    return ("an " if name[0] in "aeiou" else "a ") + name


def _wanted(t: Any) -> str:
    """What type ``t`` asks for, in words."""
    origin = get_origin(t) or t
    if origin in (Union, types.UnionType):
        arms = [_wanted(a) for a in get_args(t) if a is not type(None)]
        return " or ".join(dict.fromkeys(arms))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(t))
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", tuple: "a list", list: "a list"}
    return names.get(origin, "an object")


def _empty(t: Any) -> Any:
    """The empty value of a collection type; None for any other."""
    origin = get_origin(t) or t
    return () if origin is tuple else [] if origin is list else {} if origin is dict else None


def _optional(t: Any) -> bool:
    return get_origin(t) in (Union, types.UnionType) and type(None) in get_args(t)


def _record(cls: Any, data: Any, path: str, strict: bool) -> Any:
    if not isinstance(data, Mapping):
        raise FieldError(path, f"is {_kind(data)}, not an object")
    fill = getattr(cls, "json_fill", None)
    d: Mapping[str, Any] = {**fill(data), **data} if fill is not None else data
    hints = _hints(cls)
    derived = _derived(cls)
    named, kwargs, rest = set(derived), {}, None
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        t = hints[f.name]
        if f.metadata.get("inline"):
            if dataclasses.is_dataclass(t):
                kwargs[f.name] = _record(t, d, path, False)
                named.update(g.name for g in dataclasses.fields(t))
            else:
                rest = f
            continue
        named.add(f.name)
        kwargs[f.name] = _field(f, t, d, path, strict)
    if rest is not None:
        kwargs[rest.name] = _value(hints[rest.name], {k: v for k, v in d.items() if k not in named}, path, strict)
    elif strict and set(d) - named:
        raise FieldError(path, f"has unknown fields {sorted(set(d) - named)}; known: {sorted(named)}")
    try:
        out = cls(**kwargs)
    except FieldError:
        raise
    except ValueError as exc:
        raise FieldError(path, str(exc)) from None
    for name in derived:
        own = to_json(getattr(out, name))
        if name in d and d[name] != own:
            raise FieldError(_key(path, name), f"is {d[name]!r}, not {own!r} (it follows from the other fields)")
    return out


def _field(f: dataclasses.Field[Any], t: Any, d: Mapping[str, Any], path: str, strict: bool) -> Any:
    """Field ``f`` (of type ``t``) of object ``d``, with the defaults of the module docstring."""
    where = _key(path, f.name)
    v = d.get(f.name)
    if v is None:
        if _optional(t) and f.name in d:
            return None
        default = _default(f)
        if default is not dataclasses.MISSING:
            return default
        if _optional(t):
            return None
        empty = _empty(t)
        if empty is not None:
            return empty
        if f.name not in d:
            raise FieldError(where, "is missing")
    return _value(t, v, where, strict)


def _value(t: Any, v: Any, where: str, strict: bool) -> Any:
    """``v`` as type ``t``, or a :class:`FieldError` at ``where``."""
    if t is Any:
        return v
    origin, args = get_origin(t), get_args(t)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1:
            return _value(arms[0], v, where, strict)
        for a in arms:
            try:
                return _value(a, v, where, strict)
            except FieldError:
                continue
    elif origin is Literal and any(v == a and type(v) is type(a) for a in args):
        return v
    elif dataclasses.is_dataclass(t):
        return _record(t, v, where, strict)
    elif origin in (tuple, list) and isinstance(v, list | tuple):
        if origin is tuple and args[-1:] != (Ellipsis,):  # a fixed-length tuple
            if len(v) != len(args):
                raise FieldError(where, f"has {len(v)} items, not {len(args)}")
            return tuple(_value(a, x, f"{where}[{i}]", strict) for i, (a, x) in enumerate(zip(args, v, strict=True)))
        items = [_value(args[0], x, f"{where}[{i}]", strict) for i, x in enumerate(v)]
        return tuple(items) if origin is tuple else items
    elif origin is dict and isinstance(v, Mapping):
        return {k: _value(args[1], x, _key(where, k), strict) for k, x in v.items()}
    elif t in _SCALARS and _SCALARS[t](v):
        return v
    found = repr(v) if origin is Literal else _kind(v)
    raise FieldError(where, f"is {found}, not {_wanted(t)}")
