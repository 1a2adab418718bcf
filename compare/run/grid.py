"""A sweep's grid: ``tokens x dtypes x modes x backends`` at a fixed model, dim and hidden, as :class:`Cell` s with
stable keys (``backend|case name|mode``). See ``compare.run.sweep`` for the command."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compare.formats.codec import from_json, to_json
from compare.problem.cases import (
    MODELS,
    MODULE_MODEL,
    Case,
    InputError,
    ModuleFile,
    Shape,
    Weights,
    check_name,
    check_seed,
    is_moe,
)

DEFAULT_TOKENS: tuple[int, ...] = (1, 16, 128, 1024)
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: Config keys that define the grid; a restart must match them exactly.
GRID_KEYS: tuple[str, ...] = ("grid", "backends", "dtypes", "modes", "timing")


@dataclass(frozen=True)
class Cell:
    """One unit of a run or sweep: a backend on a case in a mode, at a world size (a run's tensor-parallel cells)."""

    backend: str
    case: Case
    mode: str
    world_size: int = 1

    @property
    def key(self) -> str:
        return cell_key(self.backend, self.case.name, self.mode)

    def label(self) -> str:
        dtype = SHORT_DTYPE.get(self.case.dtype, self.case.dtype)
        return f"{self.backend} tokens={self.case.shape.tokens} {dtype} {self.mode}"


def cell_key(backend: str, case_name: str, mode: str) -> str:
    """The key a cell is stored and skipped under: ``backend|case name|mode``."""
    return f"{backend}|{case_name}|{mode}"


def result_key(r: dict[str, Any]) -> str:
    return cell_key(r["backend"], r["case"], r["mode"])


# --- the grid -------------------------------------------------------------------------------------------------


def grid_config(
    model: str,
    dim: int,
    hidden: int,
    tokens: Sequence[int],
    seq: int = 1,
    dist: str = "normal",
    seed: int = 0,
    weights: Weights | Sequence[Weights] | None = None,
    module: ModuleFile | None = None,
) -> dict[str, Any]:
    """The ``grid`` part of a sweep's config (validated: a bad size raises :class:`InputError`); ``weights``, the
    checkpoint every case reads its parameters from, and ``module``, the user's MLP file every case computes (model
    ``module``), are keys only where given (a sweep without them has the grid it always had). ``weights`` as a list
    (``--layers``: one per layer) is the key ``layers``, and every token count, dtype and mode runs on each."""
    if is_moe(model):
        raise InputError(f"sweep: a mixture-of-experts model ({model}) has no sweep yet; run it with `run`")
    if module is None or model != MODULE_MODEL:
        check_name("model", model, MODELS)
    check_seed(seed)
    Shape(1, seq, dim, hidden)  # validates seq, dim, hidden (before seq divides anything)
    if not tokens:
        raise InputError("give at least one token count (--tokens)")
    for t in tokens:
        if not isinstance(t, int) or t <= 0:
            raise InputError(f"token counts must be positive integers, got {t!r}")
        if t % seq:
            raise InputError(f"token count {t} is not a multiple of --seq {seq} (batch = tokens / seq)")
    if len(set(tokens)) != len(tokens):
        raise InputError(f"token counts repeat: {list(tokens)}")
    grid = {
        "model": model,
        "dim": dim,
        "hidden": hidden,
        "seq": seq,
        "tokens": list(tokens),
        "dist": dist,
        "seed": seed,
    }
    one = weights if isinstance(weights, Weights) else None
    many = list(weights) if weights is not None and not isinstance(weights, Weights) else []
    if len(many) == 1 and many[0].layer is None:
        one, many = many[0], []
    grid |= {"weights": to_json(one)} if one is not None else {}
    grid |= {"layers": [to_json(w) for w in many]} if many else {}
    return grid | ({"module": to_json(module)} if module is not None else {})


def grid_weights(g: dict[str, Any]) -> list[Weights | None]:
    """The checkpoints of a sweep's grid, one per layer (``layers``), or its one (``weights``); ``[None]`` for drawn
    weights."""
    if g.get("layers"):
        return [from_json(Weights, w, strict=True) for w in g["layers"]]
    return [from_json(Weights, g["weights"], strict=True) if g.get("weights") is not None else None]


def cells_from_config(config: dict[str, Any]) -> list[Cell]:
    """Every cell of a sweep config, in run order: layers (``--layers``), then tokens, then dtype, then mode, then
    backend."""
    g = config["grid"]
    module = from_json(ModuleFile, g["module"], strict=True) if g.get("module") is not None else None
    cells: list[Cell] = []
    for weights in grid_weights(g):
        for t in g["tokens"]:
            shape = Shape(t // g["seq"], g["seq"], g["dim"], g["hidden"])
            for dtype in config["dtypes"]:
                case = Case(g["model"], shape, dtype, g["dist"], g["seed"], weights, module)
                for mode in config["modes"]:
                    cells.extend(Cell(b, case, mode) for b in config["backends"])
    return cells
