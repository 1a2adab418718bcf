"""The hand-written Triton kernels both frameworks launch, and the one choice of how Triton runs them.

Framework-neutral: this package imports ``triton``, numpy and the standard library, never torch, jax,
``torch_impl``, ``jax_impl`` or ``compare`` (``tests/test_layers.py`` checks the imports and imports every module
here with torch and jax blocked).
``torch_impl.ops`` launches the kernels on torch tensors, ``jax_impl.backends.triton`` on JAX arrays through
``jax_triton.triton_call``; neither keeps a kernel of its own.

* :mod:`triton_impl.env`: :func:`~triton_impl.env.choose`, the process's one choice between compiled GPU kernels
  and Triton's CPU interpreter (``TRITON_INTERPRET``), and ``FP_FUSION``. Imports no triton.
* :mod:`triton_impl.glu_kernels`: the elementwise ``act(g) * u`` kernels (forward, backward) and the shared fp32
  activation math, with their launch constants.
* :mod:`triton_impl.glu_matmul_kernels`: the GEMM with the activation in its epilogue, the plain GEMM, their
  autotune lists (each entry with its GPU build numbers) and interpreter tiles.
* :mod:`triton_impl.moe_kernels`: a mixture-of-experts block's experts as grouped GEMMs over the assignments sorted
  by expert: ``gate_up`` with the gated activation (SwiGLU, gpt-oss's clamped form) in its epilogue, forward and
  backward, and a plain grouped GEMM; one launch config.
* :mod:`triton_impl.gpu_build`: the triton side of the GPU build (``python -m compare gpu-build``): the catalogue
  of the kernel modules it is given, source hashes, one compile for sm_90/sm_80 without a GPU and its ``ptxas`` /
  ``cuobjdump`` numbers, and the worker process the compare side starts; runs where only triton is installed.

Each kernel module declares what the GPU build compiles of it, beside its kernels: ``GPU_BUILD``, a tuple of
:class:`triton_impl.gpu_build.entry.BuildEntry`. The modules built are the ones the registry's backends name
(``BackendSpec.kernels``), so a new kernel module needs no list edited here.

The interpreter choice, by design made once and before any kernel exists: ``@triton.jit`` decides, when it decorates
a function, whether it becomes a compiled kernel or an interpreted one, by reading ``TRITON_INTERPRET``; a process
whose kernels were decorated under different values would mix the two. So :func:`triton_impl.env.choose` is the
only place the variable is decided, and it runs before triton is imported: each kernel module calls it as its
first statement (importing a kernel is enough to make the choice, whoever imports it), and ``torch_impl``'s
package init calls it too (``torch.compile``'s Inductor imports triton on its own). The first call decides; every
later call returns the same answer, and raises if the environment has been changed to say otherwise since.
Importing this package itself decides nothing and imports nothing.
"""
