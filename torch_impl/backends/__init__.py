"""One small file per torch backend; each exposes ``BACKEND`` for ``compare.backends.registry``."""
