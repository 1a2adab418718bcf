"""Where a sweep's cells run: the engines, one frozen registry line each (as the backends' registry), and the
contract between ``compare.run.sweep`` and an engine.

``local`` (the default) runs the cells here, one after another, or each in its own worker process (``--isolate``).
``ray`` runs each cell as a Ray task on a Ray cluster (``compare.cluster.ray_engine``): Ray is an optional extra,
imported only when that engine is asked for, so ``compare`` imports no framework and no engine at import time. An
engine is opened (:class:`Runner`) before the sweep writes its header and closed when it ends, however it ends; in
between it is the executor of the sweep's cells (``compare.run.conductor``), which stores each as it finishes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from compare.problem.cases import InputError, check_name
from compare.run.conductor import Executor
from compare.run.tp_hosts import check_addr, check_port

#: What the cluster extra installs (the message of an engine whose package is missing).
CLUSTER_EXTRA = "pip install -e '.[cluster]'"


@dataclass(frozen=True, kw_only=True)
class Engine:
    """Registry line of an engine: its name, what it is, the module that implements it (``open_runner(options) ->
    Runner``; ``""`` for the local engine, which lives in ``compare.run.sweep``), the top-level package it needs
    and how to install that package."""

    name: str
    about: str
    target: str = ""
    requires: str = ""
    install: str = ""


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(name="local", about="here, one cell after another (each in its own worker process with --isolate)"),
        Engine(
            name="ray",
            about="one Ray task per cell on a Ray cluster (--address HOST:PORT or auto; none: a local Ray instance)",
            target="compare.cluster.ray_engine",
            requires="ray",
            install=CLUSTER_EXTRA,
        ),
    )
}
DEFAULT_ENGINE = "local"


@dataclass(frozen=True)
class EngineOptions:
    """What the command line says about the engine: the cluster's address (None: a local instance), how often a
    cell whose worker or node was lost is run again, the seconds before a cell is ended, the CPUs each cell asks for,
    and the environment variables that travel to the workers."""

    address: str | None = None
    retries: int = 1
    cell_timeout_s: float | None = None
    cpus_per_cell: float = 1.0
    env: dict[str, str] = field(default_factory=dict)


class Runner(Executor, Protocol):
    """An open engine (the local one, or a connection to a cluster): a ``compare.run.conductor.Executor``."""

    def describe(self) -> dict[str, Any]:
        """What the header line records of it: its name, and for a cluster its address, nodes and start-up time."""
        ...

    def close(self) -> None:
        """End what the engine started (a local Ray instance), or leave a cluster given by address as found."""
        ...


def engine(name: str) -> Engine:
    """Look up an engine; an unknown name raises InputError naming the known ones."""
    check_name("engine", name, list(ENGINES))
    return ENGINES[name]


def check_address(address: str) -> str:
    """``auto`` or ``HOST:PORT`` (a host name, an IPv4 address or a bracketed IPv6 one, and a TCP port); anything
    else raises InputError naming the allowed forms."""
    if address == "auto":
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InputError(f"--address must be auto or HOST:PORT (e.g. 10.0.0.1:6379 or head-node:6379), got {address!r}")
    check_port(int(port), "--address's port")
    return f"{check_addr(host, '--address')}:{int(port)}"


def open_runner(e: Engine, options: EngineOptions) -> Runner:
    """Open engine ``e`` (not the local one): import its module, which imports its package only now; a missing
    package is an InputError saying how to install it."""
    if e.requires:
        try:
            importlib.import_module(e.requires)
        except ImportError as exc:
            raise InputError(
                f"--engine {e.name} needs the {e.requires} package, which does not import here ({exc}): {e.install}"
            ) from exc
    return importlib.import_module(e.target).open_runner(options)
