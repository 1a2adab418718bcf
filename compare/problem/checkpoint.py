"""Real checkpoint weights for the built-in models: the Hugging Face names of each model's parameters and the loader
of a safetensors checkpoint into the canonical ``(out, in)`` parameters of ``Case.weight_shapes()`` (numpy only).

``--weights FILE [--prefix P]`` (``compare.cli.args``) makes a case whose :class:`~compare.problem.cases.Weights`
name the checkpoint (absolute path, sha256, prefix); ``golden.make_problem`` then reads its parameters here instead of
drawing them (``x`` and ``dy`` are drawn from the seed as always). Every name is looked up as ``prefix + name``:

- ``geglu``, ``swiglu`` (Llama, Mistral, Qwen, Gemma): ``gate_proj.weight``, ``up_proj.weight``,
  ``down_proj.weight``, torch ``(out, in)`` already (canonical ``gate``, ``up``, ``down``);
- ``gelu-mlp`` (GPT-2): ``c_fc.weight``, ``c_fc.bias``, ``c_proj.weight``, ``c_proj.bias``; GPT-2's ``Conv1D``
  stores its weight ``(in, out)``, so ``c_fc.weight [dim, hidden]`` is canonical ``fc1`` transposed and
  ``c_proj.weight [hidden, dim]`` is ``fc2`` transposed; the biases are ``b1`` and ``b2``;
- ``linear``: ``weight``, ``bias``;
- a module case (``--module``): every name of its module's ``state_dict``, as it is (torch layout).

A checkpoint is one ``.safetensors`` file, or a sharded one: its ``model.safetensors.index.json``, whose
``weight_map`` maps each tensor name to the shard file (in the index's folder) that holds it; a tensor is read from
its shard. A single file is identified by the sha256 of its bytes; a sharded checkpoint (many gigabytes) by the
tensors a case reads (:func:`tensors_sha256`: their names, dtypes, shapes and bytes), so a case is hashed, and checked
again by a worker, in the time its own tensors take to read, and one layer's case does not change when another
layer's tensors do.

Layers (``--layers all``, ``0-3``, ``0,5,7`` with a prefix template such as ``model.layers.{i}.mlp.``):
:func:`layer_weights` makes one :class:`~compare.problem.cases.Weights` per layer index, ``{i}`` replaced by it;
``all`` is every index for which the template's names are in the checkpoint (read from the index's or the header's
names). A layer that lacks a name, an index not there, or a template that matches nothing is refused naming it.

Dtypes: a tensor of the case's dtype (F32, BF16, F16 for float32, bfloat16, float16) is used as it is; a BF16 or F16
tensor serves a float32 case, widened (exact: float32 holds every bfloat16 and float16 value), and the case's
``Weights.dtypes`` record it, so the report says so; a float32 tensor is taken for a bfloat16 or float16 case when
every value of it is one the case dtype holds exactly. Any other pair (F16 for a bfloat16 case, BF16 for a float16
one: neither holds the other's values) is refused. The values are used as they are. Every refusal (no such file, not
safetensors, a missing name, another shape, another dtype, a value that is not finite, a file changed since its
sha256 was taken) is an :class:`~compare.problem.cases.InputError` naming both sides: the CLI exits 2 with its one
line.

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
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compare.problem.cases import Case, FileChanged, InputError, ModuleFile, Weights
from compare.problem.moe import MOE_SPECS
from compare.problem.reference import round_to_dtype


class WeightsChanged(FileChanged):
    """A case's weights file no longer has the sha256 the case was made with (edited or replaced since the run
    started): a run or a worker that rebuilds the case's golden data refuses it, naming the file and both hashes."""


@dataclass(frozen=True)
class Source:
    """Where a canonical parameter is in a checkpoint: its name (before the prefix) and whether it is stored
    transposed, its last two axes swapped (``(in, out)``: GPT-2's ``Conv1D``, gpt-oss's fused experts). A MoE
    parameter stored one tensor per expert (a Hugging Face hub checkpoint's ``experts.{e}.gate_proj.weight``) has
    ``experts`` E: ``name`` and then each of ``then`` (``{e}`` the expert's index) are that expert's rows in order
    (gate, then up), and the parameter is the experts' rows stacked, ``[E, rows, cols]``."""

    name: str
    transposed: bool = False
    then: tuple[str, ...] = ()
    experts: int = 0

    def stored(self) -> list[str]:
        """The names of the tensors this parameter is read from (before the prefix), in reading order."""
        if not self.experts:
            return [self.name]
        return [n.replace("{e}", str(e)) for e in range(self.experts) for n in (self.name, *self.then)]


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


def _moe_names(router: str, experts: int, gate: str, up: str, down: str) -> tuple[dict[str, Source], ...]:
    """A Qwen3-MoE or Mixtral block's two layouts: a hub checkpoint's, one tensor per expert and projection
    (``experts.{e}.<gate>``, ``<up>``, ``<down>``, each ``(out, in)``), and transformers' fused experts (its
    modules' ``state_dict``: ``experts.gate_up_proj [E, 2 hidden, dim]``, gate rows first, and ``experts.down_proj
    [E, dim, hidden]``, both canonical already)."""
    per_expert = {
        "router": Source(router),
        "gate_up": Source(f"experts.{{e}}.{gate}", then=(f"experts.{{e}}.{up}",), experts=experts),
        "down": Source(f"experts.{{e}}.{down}", experts=experts),
    }
    fused = {"router": Source(router), "gate_up": Source("experts.gate_up_proj"), "down": Source("experts.down_proj")}
    return per_expert, fused


#: Per mixture-of-experts model, the layouts a checkpoint of its block may have (the first one whose names the
#: checkpoint holds is read: :func:`pick`). gpt-oss: transformers' fused experts, each weight stored ``(in, out)``
#: (``gate_up_proj [E, dim, 2 hidden]``, gate and up interleaved as the model computes them); its hub checkpoint's
#: MXFP4 blocks and scales are not read.
MOE_NAMES: dict[str, tuple[dict[str, Source], ...]] = {
    "moe-qwen3": _moe_names(
        "gate.weight", MOE_SPECS["moe-qwen3"].experts, *(f"{p}_proj.weight" for p in ("gate", "up", "down"))
    ),
    "moe-mixtral": _moe_names("gate.weight", MOE_SPECS["moe-mixtral"].experts, "w1.weight", "w3.weight", "w2.weight"),
    "moe-gpt-oss": (
        {
            "router": Source("router.weight"),
            "router_bias": Source("router.bias"),
            "gate_up": Source("experts.gate_up_proj", transposed=True),
            "gate_up_bias": Source("experts.gate_up_proj_bias"),
            "down": Source("experts.down_proj", transposed=True),
            "down_bias": Source("experts.down_proj_bias"),
        },
    ),
}


def layouts(model: str) -> tuple[dict[str, Source], ...]:
    """The layouts a checkpoint of ``model`` may have: :data:`NAMES`' one, or a MoE model's :data:`MOE_NAMES`."""
    return MOE_NAMES[model] if model in MOE_NAMES else (NAMES[model],)


def pick(model: str, present: Iterable[str] = ()) -> dict[str, Source]:
    """The layout of ``model`` a checkpoint holding tensors ``present`` is read by: the first of :func:`layouts`
    whose every first name ends some name there (whatever the prefix); the first layout if none does (its names are
    then the ones a refusal lists)."""
    options = layouts(model)
    names = tuple(present)
    for option in options:
        if all(any(n.endswith(s.stored()[0]) for n in names) for s in option.values()):
            return option
    return options[0]


#: The safetensors dtype of each case dtype.
FILE_DTYPES: dict[str, str] = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_ITEMSIZE: dict[str, int] = {"F32": 4, "BF16": 2, "F16": 2}
#: A header larger than this is no checkpoint's (the format's own readers cap it at 100 MB).
MAX_HEADER = 100_000_000
#: How a sharded checkpoint's index is named (``model.safetensors.index.json``): a path ending so is read as one.
INDEX_SUFFIX = ".json"


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


def sources(case: Case, present: Iterable[str] = ()) -> dict[str, Source]:
    """Per canonical parameter of ``case``, where it is in a checkpoint holding tensors ``present``: :data:`NAMES`
    of a built-in model (a MoE model's layout that ``present`` holds: :func:`pick`); a module case's
    ``state_dict`` names as they are."""
    if case.module is not None:
        return {name: Source(name) for name in case.weight_shapes()}
    return pick(case.model, present)


def file_shape(case: Case, source: Source, param: str) -> tuple[int, ...]:
    """The shape the checkpoint stores each tensor of canonical parameter ``param`` of ``case`` in, read from
    ``source``: transposed where due (the last two axes swapped), one expert's part of the rows where stored per
    expert."""
    shape = case.weight_shapes()[param]
    if source.experts:
        shape = (shape[1] // (1 + len(source.then)), *shape[2:])
    return (*shape[:-2], shape[-1], shape[-2]) if source.transposed else shape


def _not_safetensors(path: str, why: str) -> InputError:
    return InputError(f"--weights {path} is not a safetensors file: {why}")


def _open(path: str, what: str = "--weights") -> tuple[mmap.mmap | None, int]:
    """The file mapped read-only (None when empty) and its size; no file, a folder or an unreadable one raises
    (``what``: how the message names it, ``--weights`` or a shard of an index)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} {path}: no such file")
    if not p.is_file():
        raise InputError(
            f"{what} {path} is not a file (a checkpoint is one safetensors file, or a sharded one's "
            "model.safetensors.index.json)"
        )
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None), size
    except OSError as exc:
        raise InputError(f"{what} {path} cannot be read: {exc.strerror or exc}") from exc


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


def is_index(path: str) -> bool:
    """Whether ``path`` names a sharded checkpoint's index (``*.json``): what decides how a checkpoint is read and
    identified (:class:`~compare.problem.cases.Weights`' ``sharded``)."""
    return path.endswith(INDEX_SUFFIX)


def _index(path: str) -> dict[str, str]:
    """A sharded checkpoint's ``weight_map``: tensor name -> shard file name (a plain name, in the index's folder).
    A JSON file that is no index (no ``weight_map`` object) is refused as not safetensors, as it always was."""
    mm, size = _open(path)
    try:
        raw = mm[:] if mm is not None and size <= MAX_HEADER else b""
    finally:
        _close(mm)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        mm, size = _open(path)
        try:
            _header(path, mm, size)  # a safetensors file under a .json name is still no index
        except InputError as exc:
            raise InputError(f"{exc} (nor a sharded checkpoint's index: no weight_map object in it)") from None
        finally:
            _close(mm)
        raise InputError(f"--weights {path} is not a sharded checkpoint's index: it holds no weight_map object")
    shards: dict[str, str] = {}
    for name, shard in data["weight_map"].items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", ".."):
            raise InputError(
                f"--weights {path}: tensor {name!r} maps to {shard!r}, not the name of a shard file in its folder"
            )
        shards[name] = shard
    if not shards:
        raise InputError(f"--weights {path}: its weight_map names no tensor")
    return shards


class Checkpoint:
    """A checkpoint opened for reading: one safetensors file, or a sharded checkpoint's index and the shards it
    names, each shard mapped and its header read on first use. A context manager: leaving it unmaps them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.index = _index(path) if is_index(path) else None
        self._files: dict[str, tuple[mmap.mmap | None, dict[str, Entry]]] = {}
        if self.index is None:
            self._file(path)  # the file's header read now: a bad file is refused at once

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for mm, _ in self._files.values():
            _close(mm)
        self._files.clear()

    def _file(self, path: str) -> tuple[mmap.mmap | None, dict[str, Entry]]:
        if path not in self._files:
            what = "--weights" if path == self.path else f"--weights {self.path}: shard"
            mm, size = _open(path, what)
            try:
                self._files[path] = (mm, _header(path, mm, size))
            except BaseException:
                _close(mm)
                raise
        return self._files[path]

    def names(self) -> list[str]:
        """Every tensor name of the checkpoint (the index's, or the file's header's), sorted."""
        return sorted(self.index if self.index is not None else self._file(self.path)[1])

    def where(self, name: str) -> str | None:
        """The file that holds tensor ``name`` (a shard's absolute path, or the file), None when it is not there."""
        if self.index is None:
            return self.path if name in self._file(self.path)[1] else None
        shard = self.index.get(name)
        return None if shard is None else str(Path(self.path).parent / shard)

    def entry(self, name: str) -> tuple[str, mmap.mmap, Entry] | None:
        """Tensor ``name``: the file holding it, that file mapped and its entry; None when the checkpoint lacks it. A
        name the index maps to a shard whose header lacks it is refused."""
        file = self.where(name)
        if file is None:
            return None
        mm, entries = self._file(file)
        e = entries.get(name)
        if e is None:
            raise InputError(f"{name} is not in {file}, though {self.path} maps it there")
        assert mm is not None  # a header was read
        return file, mm, e


def _names_of(case_names: Iterable[str] | None, prefix: str) -> list[str]:
    return sorted({prefix + n for n in case_names or ()})


def tensor_digests(ck: Checkpoint, names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Per tensor ``names`` (sorted; each must be there), its sha256: of its name, dtype and shape (a JSON line), its
    byte count and its bytes."""
    out = []
    for name in sorted(set(names)):
        found = ck.entry(name)
        if found is None:
            raise InputError(f"{name} is not in {ck.path}")
        _, mm, e = found
        h = hashlib.sha256(json.dumps([name, e.dtype, list(e.shape)]).encode() + b"\n")
        h.update((e.end - e.begin).to_bytes(8, "little"))
        h.update(memoryview(mm)[e.begin : e.end])
        out.append((name, h.hexdigest()))
    return tuple(out)


def tensors_sha256(digests: Iterable[tuple[str, str]]) -> str:
    """The sha256 a sharded checkpoint's case is identified by: of its tensors' :func:`tensor_digests`, one line
    ``name digest`` each, in name order."""
    return hashlib.sha256("".join(f"{n} {d}\n" for n, d in sorted(digests)).encode()).hexdigest()


def _file_sha256(path: str) -> str:
    mm, _ = _open(path)
    try:
        return hashlib.sha256(mm if mm is not None else b"").hexdigest()
    finally:
        _close(mm)


def _dtypes(ck: Checkpoint, names: list[str]) -> tuple[str, ...]:
    """The dtypes of the tensors ``names`` that the checkpoint holds (a missing one is the loader's to name)."""
    found = (ck.entry(n) for n in names if ck.where(n) is not None)
    return tuple(sorted({f[2].dtype for f in found if f is not None}))


def bare_names(model: str, module: ModuleFile | None = None, present: Iterable[str] = ()) -> list[str]:
    """The names (before the prefix) a case of ``model`` reads from a checkpoint holding tensors ``present``:
    :data:`NAMES`' for a built-in model (a MoE model's layout there: :func:`pick`), the ``state_dict`` names of a
    module case's file."""
    if module is not None:
        return [name for name, _ in module.params]
    return [n for s in pick(model, present).values() for n in s.stored()]


def weights(path: str, prefix: str = "", names: Iterable[str] | None = None, layer: int | None = None) -> Weights:
    """The :class:`~compare.problem.cases.Weights` of ``--weights path --prefix prefix``: the path made absolute, the
    checkpoint checked to be readable (a file's header; an index and its shards' headers), its sha256 taken (a
    file's bytes; a sharded checkpoint's tensors ``prefix + names``, the names the case reads: :func:`bare_names`,
    needed there) and the dtypes of those tensors (where ``names`` are given)."""
    absolute = str(Path(path).expanduser().resolve())
    wanted = _names_of(names, prefix)
    with Checkpoint(absolute) as ck:
        if ck.index is not None:
            if names is None:
                raise ValueError("a sharded checkpoint's case is identified by the tensors it reads: give their names")
            for name in wanted:
                if ck.where(name) is None:
                    raise InputError(
                        f"{name} is not in {absolute}; --prefix {prefix!r} needs "
                        f"{', '.join(wanted)}{_like(name, ck.names())}"
                    )
            digests = tensor_digests(ck, wanted)
            digest = tensors_sha256(digests)
        else:
            digests, digest = (), _file_sha256(absolute)
        dtypes = _dtypes(ck, wanted)
    return Weights(absolute, digest, prefix, layer, dtypes, digests)


def _like(name: str, found: list[str]) -> str:
    """``; names there like it: ...`` (the checkpoint's names closest to a missing one), or ""."""
    close = difflib.get_close_matches(name, found, n=5, cutoff=0.5)
    return f"; names there like it: {', '.join(close)}" if close else f"; none like it among its {len(found)} names"


# --- layers -----------------------------------------------------------------------------------------------------

#: What a prefix template holds where the layer index goes.
LAYER = "{i}"
_LAYERS_HELP = "give all, a range like 0-3 or a list like 0,5,7"


def parse_layers(spec: str) -> list[int] | None:
    """The layer indices of ``--layers``: None for ``all``; else a range ``A-B`` (both included), a list ``a,b,c``,
    or both comma-separated (``0-3,7``), in the order given. Bad input (empty, not an index, a range that runs
    down, an index twice) raises :class:`InputError` naming it."""
    text = spec.strip()
    if text == "all":
        return None
    if not text:
        raise InputError(f"--layers {spec!r} is empty: {_LAYERS_HELP}")
    out: list[int] = []
    for item in text.split(","):
        lo, dash, hi = item.strip().partition("-")
        ends = [lo, hi] if dash else [lo]
        if not all(e.strip().isdecimal() for e in ends):
            raise InputError(f"--layers {spec}: {item.strip()!r} is not a layer index or a range ({_LAYERS_HELP})")
        a, b = int(ends[0]), int(ends[-1])
        if b < a:
            raise InputError(f"--layers {spec}: the range {a}-{b} runs down, so it holds no layer ({_LAYERS_HELP})")
        out += range(a, b + 1)
    seen: set[int] = set()
    for i in out:
        if i in seen:
            raise InputError(f"--layers {spec}: layer {i} is given twice")
        seen.add(i)
    return out


def span(indices: Iterable[int]) -> str:
    """Layer indices in short: ``0-3, 7``."""
    xs = sorted(set(indices))
    runs: list[list[int]] = []
    for i in xs:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def layer_prefix(template: str, i: int) -> str:
    """The prefix of layer ``i``: the template with each ``{i}`` replaced by the index."""
    return template.replace(LAYER, str(i))


def found_layers(names: Iterable[str], template: str, bare: Iterable[str]) -> set[int]:
    """Every index ``i`` for which some name ``template(i) + b`` (``b`` in ``bare``) is among ``names`` (an index
    written as Python writes it: ``7``, never ``07``)."""
    parts = [re.escape(p) for p in template.split(LAYER)]
    pattern = re.compile(parts[0] + "".join(r"(\d+)" + p if k == 0 else r"\1" + p for k, p in enumerate(parts[1:])))
    ends = tuple(bare)
    out = set()
    for name in names:
        m = pattern.match(name)
        if m and name[m.end() :] in ends and str(int(m[1])) == m[1]:
            out.add(int(m[1]))
    return out


def layer_weights(path: str, template: str, spec: str, names: Iterable[str]) -> list[Weights]:
    """One :class:`~compare.problem.cases.Weights` per layer of ``--layers spec`` (:func:`parse_layers`), each with
    its prefix (``template``'s ``{i}`` replaced) and its index, in the order given (``all``: ascending). Every layer
    must hold every name the case reads (``names``, :func:`bare_names`). A single file is hashed once for all of
    them; a sharded checkpoint's layer by its own tensors. Refused, naming what is wrong: a template without
    ``{i}``, no layer matched, an index the checkpoint lacks, a layer that lacks one of the names."""
    if LAYER not in template:
        raise InputError(
            f"--layers needs a --prefix template with {LAYER} where the layer index goes (e.g. "
            f"model.layers.{LAYER}.mlp.), got --prefix {template!r}"
        )
    wanted = parse_layers(spec)
    bare = sorted(set(names))
    absolute = str(Path(path).expanduser().resolve())
    with Checkpoint(absolute) as ck:
        present = ck.names()
        found = found_layers(present, template, bare)
        first = template + bare[0]
        if not found:
            sample = ", ".join(present[:3]) + (", ..." if len(present) > 3 else "")
            raise InputError(
                f"--layers {spec}: no layer of {absolute} matches --prefix {template!r}: no name like {first} among "
                f"its {len(present)} names ({sample})"
            )
        layers = sorted(found) if wanted is None else wanted
        for i in layers:
            if i not in found:
                raise InputError(
                    f"--layers {spec}: layer {i} is not in {absolute} (no {layer_prefix(template, i)}{bare[0]}); "
                    f"its layers under --prefix {template!r}: {span(found)}"
                )
            for b in bare:
                name = layer_prefix(template, i) + b
                if ck.where(name) is None:
                    raise InputError(
                        f"--layers {spec}: layer {i} lacks {name} in {absolute}; the case needs "
                        f"{', '.join(layer_prefix(template, i) + x for x in bare)}"
                    )
        digest = _file_sha256(absolute) if ck.index is None else ""
        out = []
        for i in layers:
            prefix = layer_prefix(template, i)
            mine = _names_of(bare, prefix)
            digests = tensor_digests(ck, mine) if ck.index is not None else ()
            sha = digest or tensors_sha256(digests)
            out.append(Weights(absolute, sha, prefix, i, _dtypes(ck, mine), digests))
    return out


# --- loading ----------------------------------------------------------------------------------------------------


def _sizes(case: Case) -> str:
    """The case as a shape error names it: ``the case (gelu-mlp, dim 96, hidden 328)``."""
    return f"the case ({case.model}, dim {case.shape.dim}, hidden {case.shape.hidden})"


def _missing(case: Case, w: Weights, name: str, found: Iterable[str]) -> InputError:
    """A name not in the file: every name the case looks up and the file's names closest to the missing one."""
    found = sorted(found)
    bare = [n for s in sources(case, found).values() for n in s.stored()]
    ends = [f for f in found if any(f.endswith(n) for n in bare)]
    close = ends or difflib.get_close_matches(name, found, n=5, cutoff=0.5)
    shown = ", ".join(close[:8]) + (f", ... ({len(close)} in all)" if len(close) > 8 else "")
    hint = f"names there like them: {shown}" if close else f"none like them among its {len(found)} names"
    if found and not close:
        hint += f" ({', '.join(found[:5])}{', ...' if len(found) > 5 else ''})"
    return InputError(
        f"{name} is not in {w.path}; the case ({case.model}, --prefix {w.prefix!r}) needs "
        f"{_listed([w.prefix + n for n in bare])}; {hint}"
    )


def _listed(names: list[str]) -> str:
    """Names for a message: all of them, or the first six and a count (a MoE layer reads hundreds)."""
    return ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:6])}, ... ({len(names)} in all)"


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


#: Per case dtype, the file dtypes it takes: its own, F32 holding only its values (checked), and for float32 the
#: narrower BF16 and F16 (widened: exact).
TAKES: dict[str, tuple[str, ...]] = {
    "float32": ("F32", "BF16", "F16"),
    "bfloat16": ("BF16", "F32"),
    "float16": ("F16", "F32"),
}
#: The case dtype of each file dtype (the report's words).
DTYPE_NAMES: dict[str, str] = {v: k for k, v in FILE_DTYPES.items()}


def widened(w: Weights | None, dtype: str) -> list[str]:
    """The dtypes (``bfloat16``, ``float16``) of ``w``'s tensors that a ``dtype`` case widens (exactly, to float32);
    empty for drawn weights, a case of the tensors' own dtype, or weights whose dtypes were not recorded."""
    if w is None or dtype != "float32":
        return []
    return [DTYPE_NAMES[d] for d in w.dtypes if d in DTYPE_NAMES and d != FILE_DTYPES[dtype]]


def _changed(case: Case, w: Weights, ck: Checkpoint) -> WeightsChanged | None:
    """The refusal of a checkpoint whose sha256 is no longer the case's (None while it is): a single file's bytes,
    a sharded checkpoint's tensors of the case (the shards holding them named)."""
    if ck.index is None:
        digest = _file_sha256(w.path)
        if digest == w.sha256:
            return None
        return WeightsChanged(
            f"weights file {w.path} changed since the run started: its sha256 is now {digest}, the case "
            f"{case.name} was made from {w.sha256}"
        )
    names = [w.prefix + n for s in sources(case, ck.names()).values() for n in s.stored()]
    missing = [n for n in names if ck.where(n) is None]
    if missing:
        return WeightsChanged(
            f"weights file {w.path} changed since the run started: it no longer maps {', '.join(missing)}, which the "
            f"case {case.name} was made from"
        )
    digests = tensor_digests(ck, names)
    digest = tensors_sha256(digests)
    if digest == w.sha256:
        return None
    was = dict(w.tensors)
    changed = [n for n, d in digests if was.get(n) != d] if was else sorted(names)
    files = " or ".join(sorted({str(ck.where(n)) for n in changed}))
    return WeightsChanged(
        f"weights file {files} changed since the run started: {', '.join(changed)} (index {w.path}) "
        f"{'is' if len(changed) == 1 else 'are'} no longer what the case {case.name} was made from (its tensors' "
        f"sha256 {w.sha256}, now {digest})"
    )


def load_params(case: Case, verify: bool = True) -> dict[str, np.ndarray]:
    """``case``'s canonical parameters (``Case.weight_shapes()``'s names, ``(out, in)``, float32 arrays holding
    case-dtype values) read from its checkpoint, after checking its sha256 against the case's (a file, or a sharded
    checkpoint's tensors of the case, changed since the case was made is :class:`WeightsChanged`, naming it;
    ``verify`` False skips it, for a check made right after :func:`weights` hashed it) and each tensor's name, shape
    and dtype against the case."""
    w = case.weights
    if w is None:
        raise ValueError(f"case {case.name} reads no weights file")
    with Checkpoint(w.path) as ck:
        if verify and (changed := _changed(case, w, ck)) is not None:
            raise changed
        params: dict[str, np.ndarray] = {}
        for param, source in sources(case, ck.names()).items():
            parts = [_read(case, w, ck, w.prefix + n, param, source) for n in source.stored()]
            if source.experts:  # each expert's parts (gate, then up) along its rows, the experts stacked
                per = len(parts) // source.experts
                parts = [np.stack([np.concatenate(parts[e * per : (e + 1) * per]) for e in range(source.experts)])]
            params[param] = parts[0]
        return params


def _read(case: Case, w: Weights, ck: Checkpoint, name: str, param: str, source: Source) -> np.ndarray:
    """Tensor ``name`` of ``ck`` as (a part of) ``case``'s canonical parameter ``param`` read from ``source``
    (a float32 array, ``(out, in)``), its shape, dtype, size and values checked against the case."""
    found = ck.entry(name)
    if found is None:
        raise _missing(case, w, name, ck.names())
    file, mm, e = found
    want = file_shape(case, source, param)
    if e.shape != want:
        canonical = f"{param} {list(case.weight_shapes()[param])}"
        how = " transposed, as the checkpoint stores it" if source.transposed else ""
        how += f", one of {source.experts} experts' parts" if source.experts else ""
        raise InputError(
            f"{name} is {list(e.shape)} in {file}; {_sizes(case)} needs {list(want)} "
            + (f"({canonical}{how})" if how else f"(canonical {param})")
        )
    wanted = FILE_DTYPES[case.dtype]
    exact = (
        f"{wanted}, or F32 holding only {case.dtype} values"
        if case.dtype != "float32"
        else f"{wanted}, or BF16 or F16 (widened exactly)"
    )
    if e.dtype not in TAKES[case.dtype]:
        raise InputError(f"{name} is {e.dtype} in {file}; the case ({case.model}, {case.dtype}) needs {exact}")
    if e.end - e.begin != math.prod(e.shape) * _ITEMSIZE[e.dtype]:
        raise _not_safetensors(
            file, f"tensor {name!r} holds {e.end - e.begin} bytes, not the {e.dtype} {list(e.shape)}'s"
        )
    values = _decode(mm, e)
    if not np.isfinite(values).all():
        i = tuple(int(k) for k in np.argwhere(~np.isfinite(values))[0])
        raise InputError(f"{name} in {file} holds {values[i]} at {list(i)}: weights must be finite")
    rounded = round_to_dtype(values, case.dtype)
    if not np.array_equal(values, rounded):
        raise InputError(
            f"{name} is {e.dtype} in {file} with values {case.dtype} cannot hold exactly (e.g. "
            f"{_first_off(values, rounded)}); the case ({case.model}, {case.dtype}) needs {exact}"
        )
    return np.ascontiguousarray(np.swapaxes(values, -1, -2) if source.transposed else values)


def check(cases: Iterable[Case]) -> None:
    """Load the weights of every case that reads a file, once per model, width, dtype and file (token counts share
    them): a bad file, name, shape or dtype is refused (:func:`load_params`) before anything is measured."""
    seen = set()
    for case in cases:
        key = (case.model, case.shape.dim, case.shape.hidden, case.dtype, case.weights, case.module)
        if case.weights is not None and key not in seen:
            seen.add(key)
            load_params(case, verify=False)  # the CLI has just hashed it (``weights``); a run checks it again
