"""Reading typed records out of parsed JSON: each ``from_dict`` of the results document takes its fields through these
helpers, so that a missing or mistyped field is a :class:`FieldError` naming it (``timing.median_s``), never a
``KeyError`` or a ``TypeError`` from deep inside the report."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, TypeVar

from compare.formats.codec import FieldError, to_json

T = TypeVar("T")
#: A parsed JSON object.
Obj = Mapping[str, Any]


def _within(exc: FieldError, outer: str) -> FieldError:
    """The same error, its path prefixed by the enclosing field ``outer``."""
    return FieldError(f"{outer}.{exc.where}" if exc.where else outer, exc.problem)


def _kind(x: Any) -> str:
    """``x``'s JSON-ish type with its article: "a str", "an int", "null"."""
    if x is None:
        return "null"
    name = type(x).__name__
    return ("an " if name[0] in "aeiou" else "a ") + name


def obj(x: Any, where: str = "") -> Obj:
    """``x`` if it is a JSON object, else a :class:`FieldError`."""
    if not isinstance(x, Mapping):
        raise FieldError(where, f"is {_kind(x)}, not an object")
    return x


_REQUIRED: Any = object()


def _absent(d: Obj, key: str, default: Any) -> bool:
    """True when ``key`` is absent and has a default; a :class:`FieldError` when it is absent and required."""
    if key in d:
        return False
    if default is _REQUIRED:
        raise FieldError(key, "is missing")
    return True


def _scalar(d: Obj, key: str, default: Any, ok: Callable[[Any], bool], what: str) -> Any:
    """Field ``key`` if ``ok`` accepts it; ``default`` when absent (required when there is none)."""
    if _absent(d, key, default):
        return default
    v = d[key]
    if not ok(v):
        raise FieldError(key, f"is {_kind(v)}, not {what}")
    return v


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def text(d: Obj, key: str, default: Any = _REQUIRED) -> str:
    """The string field ``key`` (``default`` when absent; required when no default is given)."""
    v: str = _scalar(d, key, default, lambda x: isinstance(x, str), "a string")
    return v


def integer(d: Obj, key: str, default: Any = _REQUIRED) -> int:
    """The integer field ``key`` (not a bool)."""
    v: int = _scalar(d, key, default, _is_int, "an integer")
    return v


def number(d: Obj, key: str, default: Any = _REQUIRED) -> float:
    """The number field ``key`` (an int is kept as it is, so that what was written reads back the same)."""
    v: float = _scalar(d, key, default, _is_number, "a number")
    return v


def flag(d: Obj, key: str, default: Any = _REQUIRED) -> bool:
    """The boolean field ``key``."""
    v: bool = _scalar(d, key, default, lambda x: isinstance(x, bool), "a boolean")
    return v


def _optional(read: Callable[[Obj, str], T], d: Obj, key: str) -> T | None:
    return None if d.get(key) is None else read(d, key)


def opt_text(d: Obj, key: str) -> str | None:
    """The string field ``key``, or None when absent or null (and so for the other ``opt_`` readers)."""
    return _optional(text, d, key)


def opt_integer(d: Obj, key: str) -> int | None:
    return _optional(integer, d, key)


def opt_number(d: Obj, key: str) -> float | None:
    return _optional(number, d, key)


def opt_flag(d: Obj, key: str) -> bool | None:
    return _optional(flag, d, key)


def _items(d: Obj, key: str, ok: Callable[[Any], bool], what: str) -> tuple[Any, ...]:
    v = d.get(key)
    if v is None:
        return ()
    if not isinstance(v, list | tuple):
        raise FieldError(key, f"is {_kind(v)}, not a list")
    for i, x in enumerate(v):
        if not ok(x):
            raise FieldError(f"{key}[{i}]", f"is {_kind(x)}, not {what}")
    return tuple(v)


def texts(d: Obj, key: str) -> tuple[str, ...]:
    """The list-of-strings field ``key`` (empty when absent)."""
    return _items(d, key, lambda x: isinstance(x, str), "a string")


def integers(d: Obj, key: str) -> tuple[int, ...]:
    """The list-of-integers field ``key`` (empty when absent)."""
    return _items(d, key, _is_int, "an integer")


def numbers(d: Obj, key: str) -> tuple[float, ...]:
    """The list-of-numbers field ``key`` (empty when absent)."""
    return _items(d, key, _is_number, "a number")


def mapping(d: Obj, key: str) -> dict[str, Any]:
    """A free-form object field (settings, extras): a copy, empty when absent."""
    v = d.get(key)
    return {} if v is None else dict(obj(v, key))


def opt_mapping(d: Obj, key: str) -> dict[str, Any] | None:
    """A free-form object field, or None when absent or null."""
    return _optional(mapping, d, key)


def sub(d: Obj, key: str, read: Callable[[Obj], T]) -> T | None:
    """The object field ``key`` read by ``read`` (a ``from_dict``); None when absent or null. Errors inside name
    the field."""
    v = d.get(key)
    if v is None:
        return None
    o = obj(v, key)
    try:
        return read(o)
    except FieldError as exc:
        raise _within(exc, key) from None


def subs(d: Obj, key: str, read: Callable[[Obj], T]) -> tuple[T, ...]:
    """The list-of-objects field ``key``, each read by ``read``; empty when absent."""
    out = []
    for i, x in enumerate(_items(d, key, lambda x: True, "")):
        where = f"{key}[{i}]"
        o = obj(x, where)
        try:
            out.append(read(o))
        except FieldError as exc:
            raise _within(exc, where) from None
    return tuple(out)


# --- writing ---------------------------------------------------------------------------------------------------


def plain(x: Any) -> Any:
    """JSON data of a value: a record's own ``to_dict()``, another dataclass's fields, tuples as lists, dicts
    copied; scalars as they are."""
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if is_dataclass(x) and not isinstance(x, type):
        return to_json(x)
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return _REQUIRED


def record_dict(x: Any, optional: Iterable[str] = ()) -> dict[str, Any]:
    """A record's fields, in order, as JSON data (:func:`plain`); a field named in ``optional`` is left out while it
    holds its default (so that a field added later leaves the documents that do not use it as they were)."""
    skip = set(optional)
    out = {}
    for f in fields(x):
        v = getattr(x, f.name)
        if f.name in skip and v == _default(f):
            continue
        out[f.name] = plain(v)
    return out
