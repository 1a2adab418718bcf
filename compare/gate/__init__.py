"""The parity gate: pass, deviates or fail per tensor against the golden, its record, the gate's resolution, and the
check on fresh inputs."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ("formats", "problem", "backends")
