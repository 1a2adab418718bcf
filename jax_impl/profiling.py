"""Kernels per step of a jitted JAX function, read from XLA's optimized HLO (summary schema in ``compare.kernels``).

XLA decides the kernels when it compiles: after optimization, every top-level instruction of the entry
computation that does work is one kernel (a thunk) per call. So the count needs no profiler:

- each ``fusion`` is one kernel; ``absorbed`` lists the HLO ops of its fused computation (``dot`` inside a fusion
  makes it a ``gemm``: on CPU XLA wraps GEMMs as ``kCustom`` fusions, e.g. ``__ynn_fusion``);
- each ``custom-call`` is one kernel, named by its target (``__onednn$matmul``, ``__cublas$gemm``...);
- a ``dot``/``convolution`` outside any fusion is a ``gemm`` kernel, and any other real op is one kernel;
- ``parameter``, ``constant``, ``tuple`` and ``get-tuple-element`` are skipped; ``bitcast`` and ``reshape`` (a
  transpose that only relabels the layout becomes a ``bitcast``) launch nothing and go to ``metadata_ops``.

XLA's own cost model (``compiled.cost_analysis()``) is returned under ``"xla_cost"``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from compare import kernels as ks

#: Top-level opcodes that are neither work nor metadata.
SKIPPED = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
    }
)
#: Opcodes that only relabel a buffer: no kernel.
METADATA = frozenset({"bitcast", "reshape"})
#: Opcodes left out of a fusion's ``absorbed`` list (its inputs and literals, not work).
NOT_ABSORBED = frozenset({"parameter", "constant", "tuple", "get-tuple-element"})
#: Ops that only move or relabel data inside a fusion.
_DATA_MOVEMENT = frozenset(
    {
        "bitcast",
        "reshape",
        "broadcast",
        "copy",
        "transpose",
        "slice",
        "concatenate",
        "pad",
        "convert",
        "dynamic-slice",
        "dynamic-update-slice",
    }
)
_GEMM_OPS = frozenset({"dot", "convolution"})
_GEMM_TARGET = re.compile(r"gemm|matmul|conv|dot", re.IGNORECASE)

_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s({]+)\s*[({]")
_INSTR = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-]*)\(")
_CALLS = re.compile(r"\b(?:calls|to_apply)=\{?%?(?P<c>[\w.\-]+)")
_FUSION_KIND = re.compile(r"\bkind=(?P<k>k\w+)")
_TARGET = re.compile(r'custom_call_target="(?P<t>[^"]+)"')
_BACKEND_KIND = re.compile(r'"kind":"(?P<k>__[^"]+)"')


@dataclass
class Instruction:
    """One HLO instruction: ``name = shape opcode(operands), attributes``."""

    name: str
    opcode: str
    shape: str
    rest: str
    calls: list[str] = field(default_factory=list)

    @property
    def fusion_kind(self) -> str:
        m = _FUSION_KIND.search(self.rest)
        return m.group("k") if m else ""

    @property
    def backend_kind(self) -> str:
        """A custom fusion's backend (``__ynn_fusion``, ``__triton_gemm``...), or ""."""
        m = _BACKEND_KIND.search(self.rest)
        return m.group("k") if m else ""

    @property
    def target(self) -> str:
        m = _TARGET.search(self.rest)
        return m.group("t") if m else ""


@dataclass
class HloModule:
    """The computations of an HLO module text, by name, and which one is the entry."""

    computations: dict[str, list[Instruction]]
    entry: str


def _split_shape(s: str) -> tuple[str, str]:
    """``"(f32[2], s32[]) tuple(...)"`` -> (``"(f32[2], s32[])"``, rest): a tuple shape has spaces inside."""
    s = s.lstrip()
    if not s.startswith("("):
        cut = s.find(" ")
        return (s, "") if cut < 0 else (s[:cut], s[cut:])
    depth = 0
    for i, ch in enumerate(s):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return s[: i + 1], s[i + 1 :]
    return s, ""


def parse_hlo(text: str) -> HloModule:
    """Parse HLO module text (``compiled.as_text()``) into its computations' instructions."""
    comps: dict[str, list[Instruction]] = {}
    entry = ""
    current: list[Instruction] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            m = _HEADER.match(line)
            if m and stripped.endswith("{") and not stripped.startswith("HloModule"):
                current = comps.setdefault(m.group("name"), [])
                if m.group("entry"):
                    entry = m.group("name")
            continue
        if stripped == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if m is None:
            continue
        shape, after = _split_shape(line[m.end() :])
        op = _OPCODE.match(after)
        if op is None:
            continue
        rest = after[op.end() :]
        current.append(
            Instruction(m.group("name"), op.group("op"), shape, rest, [c.group("c") for c in _CALLS.finditer(rest)])
        )
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return HloModule(comps, entry)


def fused_ops(module: HloModule, computation: str, _seen: frozenset[str] = frozenset()) -> list[str]:
    """The HLO opcodes inside a fused computation, first appearance first, nested fusions/calls included."""
    out: list[str] = []
    for ins in module.computations.get(computation, []):
        if ins.opcode in ("fusion", "call") and ins.calls and ins.calls[0] not in _seen:
            inner = fused_ops(module, ins.calls[0], _seen | {computation})
            out.extend(o for o in inner if o not in out)
        elif ins.opcode not in NOT_ABSORBED and ins.opcode not in out:
            out.append(ins.opcode)
    return out


def _fusion_kind(ins: Instruction, absorbed: list[str]) -> str:
    if _GEMM_OPS & set(absorbed) or _GEMM_TARGET.search(ins.backend_kind):
        return "gemm"
    work = [o for o in absorbed if o not in ("bitcast", "reshape", "broadcast")]
    if not work or all(o in _DATA_MOVEMENT for o in work):
        return "copy"
    if len(work) == 1:
        return ks.classify(work[0])
    return "fused"


def _base(name: str) -> str:
    """``ynn_fusion.2`` -> ``ynn_fusion``: XLA numbers instructions that share a name."""
    return re.sub(r"\.\d+$", "", name)


def hlo_kernels(module: HloModule) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """(kernels, metadata_ops, fusion kinds with counts) of the entry computation, in schedule order.

    Kernels with the same base name, kind and absorbed ops are one entry with a count.
    """
    groups: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}
    meta: dict[str, int] = {}
    fusions: dict[str, int] = {}

    def visit(computation: str, seen: frozenset[str]) -> None:
        for ins in module.computations.get(computation, []):
            op = ins.opcode
            if op in SKIPPED:
                continue
            if op in METADATA:
                meta[op] = meta.get(op, 0) + 1
                continue
            if op == "call" and ins.calls and ins.calls[0] not in seen:
                visit(ins.calls[0], seen | {computation})
                continue
            absorbed: list[str] = []
            if op == "fusion":
                absorbed = fused_ops(module, ins.calls[0]) if ins.calls else []
                name, kind = _base(ins.name), _fusion_kind(ins, absorbed)
                label = ins.fusion_kind + (f"({ins.backend_kind})" if ins.backend_kind else "")
                fusions[label] = fusions.get(label, 0) + 1
            elif op == "custom-call":
                name = ins.target or _base(ins.name)
                kind = "gemm" if _GEMM_TARGET.search(name) else "custom"
            elif op in _GEMM_OPS:
                name, kind = op, "gemm"
            else:
                name, kind = op, ks.classify(op)
            row = groups.setdefault((name, kind, tuple(absorbed)), {"count": 0, "first": ins.name})
            row["count"] += 1

    visit(module.entry, frozenset())
    base_names = [key[0] for key in groups]
    kernels = []
    for (name, kind, absorbed), row in groups.items():
        shown = name if base_names.count(name) == 1 else row["first"]
        kernels.append(ks.kernel_entry(shown, row["count"], kind=kind, absorbed=list(absorbed)))
    return kernels, [{"name": k, "count": v} for k, v in meta.items()], fusions


def xla_cost(compiled: Any) -> dict[str, float | None]:
    """XLA's cost model for a compiled executable: flops, bytes accessed and transcendentals (None if absent).

    ``cost_analysis()`` returns a dict in current JAX and a one-element list of dicts in older releases.
    """
    error = None
    try:
        raw = compiled.cost_analysis()
    except Exception as exc:  # some backends do not implement it: say so in the result, with the reason
        raw, error = None, f"{type(exc).__name__}: {exc}"
    if isinstance(raw, list | tuple):
        raw = raw[0] if raw else None
    raw = raw or {}

    def get(key: str) -> float | None:
        v = raw.get(key)
        return None if v is None else float(v)

    out: dict[str, Any] = {
        "flops": get("flops"),
        "bytes_accessed": get("bytes accessed"),
        "transcendentals": get("transcendentals"),
    }
    if error:
        out["error"] = error
    return out


def _find_trace(trace_dir: Path) -> str | None:
    """The newest trace file JAX wrote under ``trace_dir``: a Chrome ``.trace.json.gz``, else an ``.xplane.pb``."""
    for pattern in ("*.trace.json.gz", "*.xplane.pb"):
        found = sorted(trace_dir.rglob(pattern), key=lambda p: (p.stat().st_mtime, str(p)))
        if found:
            return str(found[-1])
    return None


def profile_jit(
    jitted: Callable[..., Any], args: tuple[Any, ...], step: Callable[[], Any], trace_dir: Path | None = None
) -> dict[str, Any]:
    """The kernel summary of ``jitted(*args)`` (counts per call), from its optimized HLO.

    ``jitted`` is a ``jax.jit`` function and ``args`` the arguments its step passes (pytrees of arrays); it is
    lowered and compiled here (``jitted.lower(*args).compile()``), which runs nothing. With ``trace_dir``,
    ``step`` runs once to warm up, then 3 times under ``jax.profiler.trace(trace_dir)``; the summary's ``"trace"``
    is the trace file found there. ``"xla_cost"`` holds XLA's flops / bytes accessed estimate for one call.
    """
    compiled = jitted.lower(*args).compile()  # type: ignore[attr-defined]  # a jax.jit-wrapped callable
    module = parse_hlo(compiled.as_text())
    kernels, metadata, fusions = hlo_kernels(module)
    trace = None
    if trace_dir is not None:
        trace_dir = Path(trace_dir)
        trace_dir.mkdir(parents=True, exist_ok=True)
        jax.block_until_ready(step())
        with jax.profiler.trace(str(trace_dir)):
            for _ in range(3):
                jax.block_until_ready(step())
        trace = _find_trace(trace_dir)
    notes = "XLA fusion kinds: " + ", ".join(f"{k} x{n}" for k, n in fusions.items()) if fusions else ""
    s = ks.summary("xla-hlo", jax.default_backend(), kernels, metadata, trace=trace, notes=notes)
    s["xla_cost"] = xla_cost(compiled)
    return s
