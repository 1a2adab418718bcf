"""One small file per JAX backend; each exposes ``BACKEND`` for ``compare.backends.registry``."""
