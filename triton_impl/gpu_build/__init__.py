"""The triton side of the GPU build: what to compile, how the kernels' sources hash, one compile and its numbers,
and the worker process that runs them. ``compare.gpu_build`` plans, caches, runs the workers and writes the table.

Every Triton kernel module a backend launches (``kernels=`` on its ``compare.backends.registry.BackendSpec``)
declares its own build entries beside its kernels: a module-level ``GPU_BUILD`` tuple of
:class:`triton_impl.gpu_build.entry.BuildEntry`. The modules to build are passed in (``--modules``); nothing here
lists kernels or kernel files.

* :mod:`~triton_impl.gpu_build.entry`: :class:`~triton_impl.gpu_build.entry.BuildEntry` and the canonical launch
  arguments the entries use. Imports no triton (a kernel module imports it).
* :mod:`~triton_impl.gpu_build.sources`: a kernel's source hash, from the files' text (``ast``, no import).
* :mod:`~triton_impl.gpu_build.catalogue`: the kernel modules loaded in compiled mode, their entries resolved into
  kernels, configs and hashes (:func:`~triton_impl.gpu_build.catalogue.describe`).
* :mod:`~triton_impl.gpu_build.compiler`: one (kernel, launch, config, dtype, arch) compiled for ``GPUTarget("cuda",
  cc, 32)``, and the ``ptxas -v`` / ``cuobjdump -res-usage`` text read into numbers.
* :mod:`~triton_impl.gpu_build.worker`: ``python -m triton_impl.gpu_build.worker --describe --modules ...`` prints
  the catalogue as JSON; ``--jobs FILE --rows FILE`` compiles jobs and appends one JSON line per job.

Imports the standard library, numpy, triton and ``triton_impl`` only, never ``compare`` (``tests/test_layers.py``).
This package's ``__init__`` imports nothing: a kernel module imports
:mod:`~triton_impl.gpu_build.entry` before any choice of how Triton runs is made.
"""
