"""Serialisation and text helpers every layer may use: typed JSON field readers, atomic file writes, Markdown tables
and number formatting."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ()
