"""Serialisation and text helpers every layer may use: the records' JSON codec, atomic file writes, Markdown tables
and number formatting."""

#: The packages of ``compare`` this one may import (checked by ``tests/test_layers.py``).
MAY_IMPORT: tuple[str, ...] = ()
