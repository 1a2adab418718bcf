"""``jax-triton`` (``jax_impl.backends.triton``): the torch-triton Triton kernels launched from JAX.

jax-triton runs on a GPU only. Without one these tests check that the backend is listed unavailable with its
reason, that the kernel module is torch-free, that the kernels compile ahead of time for a CUDA target with
jax-triton's calling convention, and that the backend's wiring (``custom_vjp``, grid, block, outputs, keyword
constants) is right: a stand-in for ``jax_triton.triton_call`` launches the same kernels through Triton's
interpreter on torch CPU tensors, and the result must pass the golden parity gate and equal torch-triton bit for bit.
On a GPU with jax-triton, the real ``triton_call`` must equal torch-triton bit for bit and pass the parity gate.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jax_impl.backends.triton as jt
from compare.backends.registry import BACKENDS, Availability, BackendSpec, spec
from compare.gate.parity import check_all
from compare.problem.cases import PRESETS
from compare.problem.golden import golden_for
from compare.run.cell import MODE_TENSORS, plain_reference
from compare.run.harness import run_one
from compare.timing.timer import TimingConfig
from jax_impl import device as dev
from jax_impl.interop import jax_to_torch, torch_to_jax
from tests.conftest import TRITON_INTERPRETED
from torch_impl.ops.glu import glu_backward, glu_forward
from triton_impl import env as triton_env
from triton_impl import glu_kernels

pytestmark = pytest.mark.quick

ROOT = Path(__file__).resolve().parents[1]
ON_GPU = dev.platform() in jt.GPU_PLATFORMS
TINY = PRESETS["tiny"]


@pytest.fixture
def registered() -> Iterator[BackendSpec]:
    """``jax-triton``'s registry line (the one definition of the backend)."""
    yield BACKENDS["jax-triton"]


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter at the repository root; return its stdout (fails on a non-zero exit)."""
    run_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (env or {})
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


# ---- availability ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="JAX has a GPU backend here")
def test_listed_unavailable_here_with_reason(registered: BackendSpec) -> None:
    a = spec("jax-triton").availability()
    assert not a.ok
    assert a.reason == "jax-triton runs Triton kernels on GPU only: JAX's default backend here is 'cpu'"
    case = TINY.case("bfloat16")
    r = run_one(registered, case, "fwd", plain_reference(case), TimingConfig(), {}, time_it=False)
    assert (r.status, r.reason) == ("skipped", a.reason)


def test_missing_jax_triton_is_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, an ``import jax_triton`` failure is the reason, word for word."""
    monkeypatch.setattr(dev, "platform", lambda: "gpu")
    monkeypatch.setitem(sys.modules, "jax_triton", None)  # makes `import jax_triton` raise ImportError
    with pytest.raises(ImportError) as err:
        import jax_triton  # noqa: F401
    a = jt.BACKEND.availability()
    assert (a.ok, a.reason, a.device) == (False, str(err.value), "gpu")
    with pytest.raises(RuntimeError, match="jax_triton"):
        jt.BACKEND.prepare(golden_for(TINY.case("float32")).problem, "fwd")


@pytest.mark.skipif(not glu_kernels.INTERPRETED, reason="the kernels are compiled GPU kernels here")
def test_interpreted_kernels_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "platform", lambda: "gpu")
    monkeypatch.setitem(sys.modules, "jax_triton", types.ModuleType("jax_triton"))
    assert jt.BACKEND.availability() == Availability(False, jt.INTERPRETED_REASON, device="gpu")


@pytest.mark.standard
@pytest.mark.skipif(ON_GPU, reason="JAX has a GPU backend here")
def test_backend_import_and_availability_import_nothing_heavy() -> None:
    """Importing the backend and asking for availability on CPU imports neither jax_triton, triton nor torch."""
    out = _python("""
        import sys
        import jax_impl.backends.triton as jt
        print(jt.BACKEND.availability().reason)
        print(sorted(m for m in ("jax_triton", "triton", "torch") if m in sys.modules))
    """)
    assert out.splitlines() == ["jax-triton runs Triton kernels on GPU only: JAX's default backend here is 'cpu'", "[]"]


@pytest.mark.skipif(importlib.util.find_spec("jax_triton") is None, reason="jax-triton is not installed")
def test_importing_jax_triton_keeps_triton_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """jax_triton sets TRITON_CACHE_DIR="" on import (even a failing one), which breaks every later Triton compile;
    the backend puts it back. Without a GPU jaxlib, the import's own ImportError is the reason, word for word."""
    monkeypatch.setattr(dev, "platform", lambda: "gpu")
    monkeypatch.setenv("TRITON_CACHE_DIR", "kept")
    a = jt.BACKEND.availability()
    assert os.environ["TRITON_CACHE_DIR"] == "kept"
    monkeypatch.delenv("TRITON_CACHE_DIR")
    jt.BACKEND.availability()
    assert "TRITON_CACHE_DIR" not in os.environ
    if not ON_GPU:
        assert not a.ok
        assert a.reason.startswith(
            "jax-triton requires JAX to be installed with GPU support. The installation page "
            "on the JAX documentation website includes instructions for installing a "
            "supported version:\nhttps://jax.readthedocs.io/en/latest/installation.html"
        )


# ---- the kernel module ------------------------------------------------------------------------------------------


def test_kernel_file_is_torch_free() -> None:
    """triton_impl.glu_kernels (with triton_impl.env) imports triton and never torch; compiled (the mode a GPU
    machine chooses, forced here) its kernels are real JITFunctions."""
    out = _python(
        """
        import sys
        import triton_impl.glu_kernels as k
        print("torch" in sys.modules, "triton" in sys.modules, type(k.glu_fwd_kernel).__name__)
    """,
        {"FUSION_COMPARE_TRITON": "compile"},
    )
    assert out.split() == ["False", "True", "JITFunction"]


def test_kernel_module_imports_without_torch() -> None:
    """The normal import, as jax-triton does it (the choice left to the kernel module: auto): no torch is imported
    to make it, and it is the choice this process made."""
    out = _python("import sys, triton_impl.glu_kernels as k; print('torch' in sys.modules, k.INTERPRETED)")
    assert out.split() == ["False", str(TRITON_INTERPRETED)]


@pytest.mark.standard
def test_kernels_compile_for_cuda_with_jax_triton_convention(tmp_path: Path) -> None:
    """Ahead-of-time compile (no GPU needed) of both kernels for sm_90, the way jax-triton specialises them: one
    pointer per array argument, inputs then outputs (16-byte aligned), ``n_elements``/``BLOCK``/``EXACT_BF16``/``ACT``
    as constexprs. Kernel names and launch constants are the GPU ones (TRITON_INTERPRET=0)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    out = _python(
        """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton_impl import glu_kernels as k

        for fn, n_ptr in ((k.glu_fwd_kernel, 3), (k.glu_bwd_kernel, 5)):
            for dt in ("fp32", "bf16", "fp16"):
                sig = {fn.arg_names[i]: "*" + dt for i in range(n_ptr)}
                consts = {"n_elements": 3 * 37 * 328, "BLOCK": k.BLOCK_SIZE, "EXACT_BF16": k.EXACT_BF16_CAST,
                          "ACT": "gelu_tanh"}
                sig |= {c: "constexpr" for c in consts}
                attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_ptr)}
                ck = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": k.NUM_WARPS, "enable_fp_fusion": k.FP_FUSION})
                print(ck.name, dt, k.BLOCK_SIZE, ".entry " + ck.name in ck.asm["ptx"], len(ck.asm["cubin"]) > 0)
    """,
        env={"TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)},
    )
    rows = [line.split() for line in out.splitlines()]
    assert [r[:2] for r in rows] == [
        [n, dt] for n in ("_glu_fwd_kernel", "_glu_bwd_kernel") for dt in ("fp32", "bf16", "fp16")
    ]
    assert all(r[2:] == ["1024", "True", "True"] for r in rows), rows


# ---- the wiring, through a CPU stand-in for jax_triton.triton_call ------------------------------------------


_INT_VIEW = {2: (np.int16, torch.int16), 4: (np.int32, torch.int32)}
_TORCH_DTYPES = {
    jnp.dtype(jnp.float32): torch.float32,
    jnp.dtype(jnp.bfloat16): torch.bfloat16,
    jnp.dtype(jnp.float16): torch.float16,
}


def _np_to_torch(a: np.ndarray) -> torch.Tensor:
    """Bit-exact copy of a numpy array (ml_dtypes bfloat16 included) as a torch CPU tensor."""
    npi, _ = _INT_VIEW[a.dtype.itemsize]
    return torch.from_numpy(np.array(a).view(npi)).view(_TORCH_DTYPES[a.dtype])


def _torch_to_np(t: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    _, ti = _INT_VIEW[t.element_size()]
    return t.view(ti).numpy().view(dtype)


# XLA's CPU threads, which run pure_callback hosts, flush subnormals to zero (FTZ/DAZ); the interpreter's numpy
# math would then differ from torch-triton's (run on the main thread) wherever an fp32 intermediate is subnormal.
# So the launch runs on this worker, spawned here from the main thread and so with its floating-point environment.
_LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="interpreted-triton-call")
_LAUNCHER.submit(lambda: None).result()


class InterpretedTritonCall:
    """``jax_triton.triton_call``'s convention, run on CPU: the array arguments and then one fresh buffer per
    ``out_shape`` go to the kernel positionally, every other keyword is a kernel constexpr; the launch is
    ``kernel[grid](...)`` under Triton's interpreter, from a ``jax.pure_callback``. Records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        *args: jax.Array,
        kernel: Any,
        out_shape: Any,
        grid: tuple[int, ...],
        name: str = "",
        num_warps: int | None = None,
        enable_fp_fusion: bool = True,
        **constexprs: Any,
    ) -> Any:
        self.calls.append(
            {
                "kernel": kernel,
                "name": name,
                "grid": grid,
                "num_warps": num_warps,
                "enable_fp_fusion": enable_fp_fusion,
                "constexprs": constexprs,
                "out_shape": out_shape,
                "args": [(a.shape, a.dtype) for a in args],
            }
        )
        outs = tuple(out_shape) if isinstance(out_shape, list | tuple) else (out_shape,)

        def host(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
            ins = [_np_to_torch(a) for a in arrays]
            res = [torch.empty(o.shape, dtype=_TORCH_DTYPES[jnp.dtype(o.dtype)]) for o in outs]
            _LAUNCHER.submit(lambda: kernel[grid](*ins, *res, **constexprs)).result()
            return tuple(_torch_to_np(r, jnp.dtype(o.dtype)) for r, o in zip(res, outs, strict=True))

        got = jax.pure_callback(host, outs, *args)
        return got if isinstance(out_shape, list | tuple) else got[0]


needs_interpreter = pytest.mark.skipif(
    not glu_kernels.INTERPRETED, reason="the stand-in runs the kernels in Triton's interpreter"
)


def _real_jax_triton() -> bool:
    return ON_GPU and torch.cuda.is_available() and jt.BACKEND.availability().ok


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_same_kernels_as_torch_triton_bit_for_bit(dtype: str, act: str) -> None:
    """act_mul and its VJP equal torch-triton's glu_forward / glu_backward exactly, for both activations: on a GPU
    through the real jax_triton.triton_call (CUDA tensors shared with JAX by DLPack), elsewhere through the
    interpreted stand-in."""
    if glu_kernels.INTERPRETED:
        call: InterpretedTritonCall | None = InterpretedTritonCall()
        device = torch.device("cpu")
    elif _real_jax_triton():
        call, device = None, torch.device("cuda")
    else:
        pytest.skip("compiled kernels but no GPU with jax-triton")
    act_mul = jax.jit(jt.make_act_mul(call, act))
    gen = torch.Generator().manual_seed(1)
    tdt = _TORCH_DTYPES[jnp.dtype(dtype)]
    g, u, dh = (torch.randn(3, 37, 328, generator=gen).mul(3).to(device, tdt) for _ in range(3))
    jg, ju, jdh = (torch_to_jax(t) for t in (g, u, dh))

    h = act_mul(jg, ju)
    assert torch.equal(jax_to_torch(h), glu_forward(g, u, act))
    h2, vjp = jax.vjp(act_mul, jg, ju)
    dg, du = vjp(jdh)
    want_dg, want_du = glu_backward(dh, g, u, act)
    assert torch.equal(jax_to_torch(h2), jax_to_torch(h))
    assert torch.equal(jax_to_torch(dg), want_dg) and torch.equal(jax_to_torch(du), want_du)
    if call is None:
        return
    n = g.numel()
    fwd, bwd = call.calls[0], call.calls[-1]
    assert (fwd["kernel"], bwd["kernel"]) == (glu_kernels.glu_fwd_kernel, glu_kernels.glu_bwd_kernel)
    assert len(fwd["args"]) == 2 and len(bwd["args"]) == 3 and len(bwd["out_shape"]) == 2
    for c in (fwd, bwd):
        assert c["grid"] == (-(-n // glu_kernels.BLOCK_SIZE),)
        assert c["constexprs"] == {
            "n_elements": n,
            "BLOCK": glu_kernels.BLOCK_SIZE,
            "EXACT_BF16": glu_kernels.EXACT_BF16_CAST,
            "ACT": act,
        }
        assert (c["num_warps"], c["enable_fp_fusion"]) == (glu_kernels.NUM_WARPS, triton_env.FP_FUSION)


@pytest.mark.standard
@needs_interpreter
@pytest.mark.parametrize(
    ("model", "dtype", "mode"),
    [
        ("geglu", "float32", "fwd+bwd"),
        ("geglu", "bfloat16", "fwd+bwd"),
        ("geglu", "bfloat16", "bwd"),
        ("swiglu", "float32", "fwd+bwd"),
        ("swiglu", "float16", "fwd+bwd"),
    ],
)
def test_backend_wiring_passes_golden_parity(model: str, dtype: str, mode: str) -> None:
    """The backend's Prepared (nnx module, custom_vjp, runner) with the stand-in passes the golden parity gate, the
    activation picked from the case's model."""
    case = TINY.case(dtype, model=model)
    golden = golden_for(case)
    prepared = jt.JaxTritonBackend(triton_call=InterpretedTritonCall()).prepare(golden.problem, mode)
    assert not prepared.timed
    out = prepared.step()
    prepared.sync(out)
    got = prepared.to_numpy(out)
    ref = {k: v for k, v in golden.ref.items() if MODE_TENSORS[mode](k)}
    assert set(got) == set(ref)
    parity = check_all(got, ref, plain_reference(case), case.dtype)
    assert parity.passed, parity.failures()


def test_bad_inputs_are_refused() -> None:
    act_mul = jt.make_act_mul(InterpretedTritonCall())
    with pytest.raises(ValueError, match="must match g in shape and dtype"):
        act_mul(jnp.ones((2, 3)), jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="unsupported dtype int32"):
        act_mul(jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), jnp.int32))
    assert act_mul(jnp.ones((0, 3)), jnp.ones((0, 3))).shape == (0, 3)  # empty: no launch
    with pytest.raises(ValueError, match="implements models geglu, swiglu only, not 'linear'"):
        jt.BACKEND.prepare(golden_for(PRESETS["blog-linear"].case("float32")).problem, "fwd")


# ---- on a GPU: the real thing ------------------------------------------------------------------------------------


@pytest.mark.skipif(not _real_jax_triton(), reason="needs a GPU with jax-triton")
@pytest.mark.parametrize(("dtype", "mode"), [("float32", "fwd+bwd"), ("bfloat16", "fwd+bwd"), ("bfloat16", "bwd")])
def test_gpu_parity(registered: BackendSpec, dtype: str, mode: str) -> None:
    case = TINY.case(dtype)
    r = run_one(registered, case, mode, plain_reference(case), TimingConfig(), {}, time_it=False)
    assert r.status == "ok", (r.reason, r.extras.get("traceback"))
