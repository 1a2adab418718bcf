"""fusion-compare's framework-agnostic core: cases, golden data, parity, the shared timer, the backend registry,
results and the report. Importing it imports neither torch nor jax; backends load lazily through the registry.

Public surface: ``cases``, ``golden``, ``parity``, ``timing``, ``registry``, ``harness``, ``results``, ``report``.
"""
