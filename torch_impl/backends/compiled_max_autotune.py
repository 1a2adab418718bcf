"""``torch-compile-max-autotune``: ``torch-compile`` with ``mode="max-autotune-no-cudagraphs"``: Inductor benchmarks
its GEMM choices at compile time, GEMM templates included (Triton on a GPU, C++ on a CPU that supports it), and a
template can take the activation into its epilogue; no CUDA graphs, so the shared timer's sync stays meaningful.

On a CPU, Inductor's C++ GEMM template needs the weight to be a constant of the graph (``freezing``, inference
only); in training graphs the weights are inputs, so there the GEMMs stay ``aten::mm`` (the kernel table says
which it chose)."""

from __future__ import annotations

from torch_impl.backends.compiled import CompileBackend

BACKEND = CompileBackend("torch-compile-max-autotune", mode="max-autotune-no-cudagraphs")
