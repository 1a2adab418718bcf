"""JAX/Flax backends: ``flax.nnx`` modules under ``jax.jit`` (XLA fusion), Pallas, jax-triton.

Loaded lazily by the registry; importing it imports jax.
"""
