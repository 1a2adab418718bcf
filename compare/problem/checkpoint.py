"""Real checkpoint weights for the built-in models: the Hugging Face names of each model's parameters and the loader
of a safetensors file into the canonical ``(out, in)`` parameters of ``Case.weight_shapes()`` (numpy only).

``--weights FILE [--prefix P]`` (``compare.cli.args``) makes a case whose :class:`~compare.problem.cases.Weights`
name the file (absolute path, sha256, prefix); ``golden.make_problem`` then reads its parameters here instead of
drawing them (``x`` and ``dy`` are drawn from the seed as always). Every name is looked up as ``prefix + name``:

- ``geglu``, ``swiglu`` (Llama, Mistral, Qwen, Gemma): ``gate_proj.weight``, ``up_proj.weight``,
  ``down_proj.weight``, torch ``(out, in)`` already (canonical ``gate``, ``up``, ``down``);
- ``gelu-mlp`` (GPT-2): ``c_fc.weight``, ``c_fc.bias``, ``c_proj.weight``, ``c_proj.bias``; GPT-2's ``Conv1D``
  stores its weight ``(in, out)``, so ``c_fc.weight [dim, hidden]`` is canonical ``fc1`` transposed and
  ``c_proj.weight [hidden, dim]`` is ``fc2`` transposed; the biases are ``b1`` and ``b2``;
- ``linear``: ``weight``, ``bias``;
- a module case (``--module``): every name of its module's ``state_dict``, as it is (torch layout).

A tensor must have the case's dtype (F32, BF16, F16 for float32, bfloat16, float16); a float32 tensor is taken for a
bfloat16 or float16 case when every value of it is one the case dtype holds exactly. The values are used as they are.
Every refusal (no such file, not safetensors, a missing name, another shape, another dtype, a value that is not
finite, a file changed since its sha256 was taken) is an :class:`~compare.problem.cases.InputError` naming both
sides: the CLI exits 2 with its one line.

Why a hand-written reader: ``safetensors.numpy`` has no bfloat16 (numpy has no such dtype; ``safe_open(...,
framework="numpy")`` reads a BF16 tensor's header but raises "data type 'bfloat16' not understood" on its data), and
the core may not import torch or jax. The format is small and documented
(https://github.com/huggingface/safetensors#format): an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(per tensor ``dtype``, ``shape`` and ``data_offsets`` ``[begin, end)`` into the data; an optional
``__metadata__``), then the raw little-endian data. A bfloat16 is the top half of a float32's bits.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compare.problem.cases import Case, FileChanged, InputError, Weights
from compare.problem.reference import round_to_dtype


class WeightsChanged(FileChanged):
    """A case's weights file no longer has the sha256 the case was made with (edited or replaced since the run
    started): a run or a worker that rebuilds the case's golden data refuses it, naming the file and both hashes."""


@dataclass(frozen=True)
class Source:
    """Where a canonical parameter is in a checkpoint: its name (before the prefix) and whether it is stored
    transposed, ``(in, out)`` (GPT-2's ``Conv1D``)."""

    name: str
    transposed: bool = False


_GLU = {"gate": Source("gate_proj.weight"), "up": Source("up_proj.weight"), "down": Source("down_proj.weight")}
#: Per model, per canonical parameter (``Case.weight_shapes()``'s names), its Hugging Face name.
NAMES: dict[str, dict[str, Source]] = {
    "linear": {"weight": Source("weight"), "bias": Source("bias")},
    "geglu": _GLU,
    "swiglu": _GLU,
    "gelu-mlp": {
        "fc1": Source("c_fc.weight", transposed=True),
        "b1": Source("c_fc.bias"),
        "fc2": Source("c_proj.weight", transposed=True),
        "b2": Source("c_proj.bias"),
    },
}
#: The safetensors dtype of each case dtype.
FILE_DTYPES: dict[str, str] = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_ITEMSIZE: dict[str, int] = {"F32": 4, "BF16": 2, "F16": 2}
#: A header larger than this is no checkpoint's (the format's own readers cap it at 100 MB).
MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: its dtype name, shape and byte range (absolute offsets in the file)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def expected_names(model: str, prefix: str = "") -> list[str]:
    """The names ``model``'s parameters are looked up under, the prefix included."""
    return [prefix + s.name for s in NAMES[model].values()]


def sources(case: Case) -> dict[str, Source]:
    """Per canonical parameter of ``case``, where it is in a checkpoint: :data:`NAMES` of a built-in model; a module
    case's ``state_dict`` names as they are."""
    if case.module is not None:
        return {name: Source(name) for name in case.weight_shapes()}
    return NAMES[case.model]


def file_shape(case: Case, param: str) -> tuple[int, ...]:
    """The shape the checkpoint stores canonical parameter ``param`` of ``case`` in (transposed where due)."""
    shape = case.weight_shapes()[param]
    return shape[::-1] if sources(case)[param].transposed else shape


def _not_safetensors(path: str, why: str) -> InputError:
    return InputError(f"--weights {path} is not a safetensors file: {why}")


def _open(path: str) -> tuple[mmap.mmap | None, int]:
    """The file mapped read-only (None when empty) and its size; no file, a folder or an unreadable one raises."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"--weights {path}: no such file")
    if not p.is_file():
        raise InputError(f"--weights {path} is not a file (a safetensors checkpoint is one file)")
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None), size
    except OSError as exc:
        raise InputError(f"--weights {path} cannot be read: {exc.strerror or exc}") from exc


def _header(path: str, mm: mmap.mmap | None, size: int) -> dict[str, Entry]:
    """Every tensor of a mapped safetensors file (module docstring: the format), each range checked."""
    if mm is None or size < 8:
        raise _not_safetensors(path, f"{size} bytes, fewer than the 8 of a header's length")
    n = int.from_bytes(mm[:8], "little")
    if n > min(size - 8, MAX_HEADER):
        raise _not_safetensors(path, f"its first 8 bytes give a header of {n} bytes, and the file has {size}")
    try:
        head = json.loads(mm[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_safetensors(path, f"its header is not JSON ({exc})") from None
    if not isinstance(head, dict):
        raise _not_safetensors(path, f"its header is a JSON {type(head).__name__}, not an object")
    start, out = 8 + n, {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        entry = _entry(e, start, size) if isinstance(e, dict) else None
        if entry is None:
            raise _not_safetensors(path, f"tensor {name!r} has a bad header entry {e!r}")
        out[name] = entry
    return out


def _entry(e: dict[str, object], start: int, size: int) -> Entry | None:
    """A header's entry as an :class:`Entry` (offsets made absolute), or None when it is malformed or out of range."""
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list) or not isinstance(offsets, list):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    if len(offsets) != 2 or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        return None
    begin, end = offsets
    if not 0 <= begin <= end <= size - start:
        return None
    return Entry(dtype, tuple(shape), start + begin, start + end)


def _close(mm: mmap.mmap | None) -> None:
    if mm is not None:
        with contextlib.suppress(BufferError):  # a view still held (an exception's traceback): it goes with that
            mm.close()


def weights(path: str, prefix: str = "") -> Weights:
    """The :class:`~compare.problem.cases.Weights` of ``--weights path --prefix prefix``: the path made absolute, the
    file checked to be a readable safetensors file (its header), its sha256 taken."""
    absolute = str(Path(path).expanduser().resolve())
    mm, size = _open(absolute)
    try:
        _header(absolute, mm, size)
        digest = hashlib.sha256(mm if mm is not None else b"").hexdigest()
    finally:
        _close(mm)
    return Weights(absolute, digest, prefix)


def _sizes(case: Case) -> str:
    """The case as a shape error names it: ``the case (gelu-mlp, dim 96, hidden 328)``."""
    return f"the case ({case.model}, dim {case.shape.dim}, hidden {case.shape.hidden})"


def _missing(case: Case, w: Weights, name: str, found: Iterable[str]) -> InputError:
    """A name not in the file: every name the case looks up and the file's names closest to the missing one."""
    found = sorted(found)
    bare = sources(case)
    ends = [f for f in found if any(f.endswith(s.name) for s in bare.values())]
    close = ends or difflib.get_close_matches(name, found, n=5, cutoff=0.5)
    shown = ", ".join(close[:8]) + (f", ... ({len(close)} in all)" if len(close) > 8 else "")
    hint = f"names there like them: {shown}" if close else f"none like them among its {len(found)} names"
    if found and not close:
        hint += f" ({', '.join(found[:5])}{', ...' if len(found) > 5 else ''})"
    return InputError(
        f"{name} is not in {w.path}; the case ({case.model}, --prefix {w.prefix!r}) needs "
        f"{', '.join(w.prefix + s.name for s in bare.values())}; {hint}"
    )


def _decode(mm: mmap.mmap, e: Entry) -> np.ndarray:
    """A tensor's values as a fresh float32 array (F32, F16, BF16; the caller checked the dtype and size)."""
    count = math.prod(e.shape)
    if e.dtype == "BF16":
        bits = np.frombuffer(mm, dtype="<u2", count=count, offset=e.begin).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(e.shape)
    dtype = "<f4" if e.dtype == "F32" else "<f2"
    return np.frombuffer(mm, dtype=dtype, count=count, offset=e.begin).astype(np.float32).reshape(e.shape)


def _first_off(values: np.ndarray, rounded: np.ndarray) -> str:
    """The first value that rounding changed, with its index: ``0.1 at [0, 3]``."""
    i = tuple(int(k) for k in np.argwhere(values != rounded)[0])
    return f"{float(values[i])!r} at {list(i)}"


def load_params(case: Case, verify: bool = True) -> dict[str, np.ndarray]:
    """``case``'s canonical parameters (``Case.weight_shapes()``'s names, ``(out, in)``, float32 arrays holding
    case-dtype values) read from its weights file, after checking the file's sha256 against the case's (a file
    changed since the case was made is :class:`WeightsChanged`, naming it; ``verify`` False skips it, for a check
    made right after :func:`weights` hashed the file) and each tensor's name, shape and dtype against the case."""
    w = case.weights
    if w is None:
        raise ValueError(f"case {case.name} reads no weights file")
    mm, size = _open(w.path)
    try:
        digest = hashlib.sha256(mm if mm is not None else b"").hexdigest() if verify else w.sha256
        if digest != w.sha256:
            raise WeightsChanged(
                f"weights file {w.path} changed since the run started: its sha256 is now {digest}, the case "
                f"{case.name} was made from {w.sha256}"
            )
        entries = _header(w.path, mm, size)
        assert mm is not None  # a header was read
        params: dict[str, np.ndarray] = {}
        for param, source in sources(case).items():
            name = w.prefix + source.name
            e = entries.get(name)
            if e is None:
                raise _missing(case, w, name, entries)
            want = file_shape(case, param)
            if e.shape != want:
                canonical = f"{param} {list(case.weight_shapes()[param])} transposed, as GPT-2's Conv1D stores it"
                raise InputError(
                    f"{name} is {list(e.shape)} in {w.path}; {_sizes(case)} needs {list(want)}"
                    + (f" ({canonical})" if source.transposed else f" (canonical {param})")
                )
            wanted = FILE_DTYPES[case.dtype]
            exact = f"{wanted}, or F32 holding only {case.dtype} values" if case.dtype != "float32" else wanted
            if e.dtype not in (wanted, "F32"):
                raise InputError(
                    f"{name} is {e.dtype} in {w.path}; the case ({case.model}, {case.dtype}) needs {exact}"
                )
            if e.end - e.begin != math.prod(e.shape) * _ITEMSIZE[e.dtype]:
                raise _not_safetensors(
                    w.path, f"tensor {name!r} holds {e.end - e.begin} bytes, not the {e.dtype} {list(e.shape)}'s"
                )
            values = _decode(mm, e)
            if not np.isfinite(values).all():
                i = tuple(int(k) for k in np.argwhere(~np.isfinite(values))[0])
                raise InputError(f"{name} in {w.path} holds {values[i]} at {list(i)}: weights must be finite")
            rounded = round_to_dtype(values, case.dtype)
            if not np.array_equal(values, rounded):
                raise InputError(
                    f"{name} is {e.dtype} in {w.path} with values {case.dtype} cannot hold exactly (e.g. "
                    f"{_first_off(values, rounded)}); the case ({case.model}, {case.dtype}) needs {exact}"
                )
            params[param] = np.ascontiguousarray(values.T if source.transposed else values)
        return params
    finally:
        _close(mm)


def check(cases: Iterable[Case]) -> None:
    """Load the weights of every case that reads a file, once per model, width, dtype and file (token counts share
    them): a bad file, name, shape or dtype is refused (:func:`load_params`) before anything is measured."""
    seen = set()
    for case in cases:
        key = (case.model, case.shape.dim, case.shape.hidden, case.dtype, case.weights, case.module)
        if case.weights is not None and key not in seen:
            seen.add(key)
            load_params(case, verify=False)  # the CLI has just hashed it (``weights``); a run checks it again
