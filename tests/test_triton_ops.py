"""Tests for the hand-written Triton gated-MLP kernels (GeGLU and SwiGLU: the activation a compile-time ``ACT``):
compiled on a CUDA machine, interpreted on CPU.

One test class, :class:`TestTritonOpsCompiled`, runs where this process compiles its kernels (CUDA), and its
subclass :class:`TestTritonOpsInterpreted` (``INTERPRET = True``, as JAX's Pallas tests rerun a class) runs where
the process interprets them. Triton fixes the mode when a kernel is decorated, so a process can only be one of the
two: the mode is chosen once, before triton is imported, by ``triton_impl.env.choose`` (called from
``tests/conftest.py``); this module never sets the interpreter variable. The class that does not match skips.

Every result is compared with a float64 torch reference, twice:

1. ``max|out - ref| <= TOL[dtype] * scale`` with ``scale = max|ref|`` (a per-dtype table), and
2. ``max|out - ref| <= 2 * max|torch_out - ref| + EPS[dtype] * scale`` where ``torch_out`` is the
   same computation done by plain torch at that dtype: the kernels may not be much less accurate
   than eager torch.

Every kernel test runs with both activations (``act="gelu_tanh"`` and ``act="silu"``). Negative controls: an erf
GELU instead of the tanh form, and each activation's kernel against the other's reference, must fail the checks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import torch_impl.ops.glu as glu_mod  # noqa: E402
import torch_impl.ops.glu_matmul as gm_mod  # noqa: E402
from torch_impl.ops.glu import GLUFunction, glu, glu_backward, glu_forward  # noqa: E402
from torch_impl.ops.glu_matmul import GLUMatmulFunction, fused_glu, glu_matmul, matmul  # noqa: E402
from triton_impl import env as _triton_env  # noqa: E402
from triton_impl.glu_kernels import ACTIVATIONS  # noqa: E402

pytestmark = pytest.mark.quick

#: This process's one choice (made before triton was imported; see the module docstring).
INTERPRETED = _triton_env.interpreted()
assert glu_mod._INTERPRET is INTERPRETED and gm_mod._INTERPRET is INTERPRETED, "kernels built under another mode"
#: Where the kernels' tensors live: CUDA when compiled, CPU under the interpreter.
DEVICE = "cpu" if INTERPRETED else "cuda"

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]

# Max abs error allowed, relative to the reference's max |value|. fp32: ~1e-5 (the kernels
# differ from torch only in summation order and tanh evaluation). bf16/fp16: ~4 units of
# roundoff (2**-8, 2**-11): results are rounded to the dtype, GEMM inputs already carry that
# rounding, and the backward chains two rounded steps.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
# Slack added to "2 x plain-torch error", relative to scale: a quarter of a unit of roundoff,
# so a lucky near-exact torch result does not make the bound unreachable.
EPS = {torch.float32: 1.5e-8, torch.bfloat16: 1e-3, torch.float16: 1.2e-4}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=_gen(seed)) * scale).to(device=DEVICE, dtype=dtype)


def _compare(out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, dtype: torch.dtype):
    """Return (ok, message) for the two checks described in the module docstring."""
    assert out.shape == ref.shape == torch_out.shape, (out.shape, ref.shape, torch_out.shape)
    assert out.dtype == dtype, (out.dtype, dtype)
    ref = ref.double()
    scale = ref.abs().max().item() or 1.0
    err = (out.double() - ref).abs().max().item()
    err_torch = (torch_out.double() - ref).abs().max().item()
    tol = TOL[dtype] * scale
    bound = 2.0 * err_torch + EPS[dtype] * scale
    ok = math.isfinite(err) and err <= tol and err <= bound
    msg = (
        f"{dtype}: max err {err:.3e} (rel {err / scale:.3e}); tol {tol:.3e} (rel {TOL[dtype]:.1e}); "
        f"plain torch err {err_torch:.3e} -> bound {bound:.3e}; scale {scale:.3e}"
    )
    return ok, msg


def assert_close(out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    ok, msg = _compare(out, ref, torch_out, dtype)
    print(f"{what}: {msg}")  # shown with pytest -s / -rP
    assert ok, f"{what}: {msg}"


def _geglu_ref(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.gelu(g, approximate="tanh") * u


#: Plain torch ``act(g) * u`` per activation (the references: float64 or the kernels' dtype).
REFS = {"gelu_tanh": _geglu_ref, "silu": lambda g, u: F.silu(g) * u}
ACTS = list(REFS)
assert tuple(ACTS) == ACTIVATIONS


# (leading dims of x, K, N): the brief's 3x37 tokens 96 -> 328, and a shape with K and M not
# multiples of any block size.
GEMM_SHAPES = [((3, 37), 96, 328), ((29,), 45, 70)]
GEMM_IDS = ["3x37x96->328", "29x45->70"]


def _gemm_inputs(lead: tuple[int, ...], K: int, N: int, dtype: torch.dtype, seed: int):
    x = _randn(*lead, K, seed=seed, dtype=dtype)
    w_gate = _randn(N, K, seed=seed + 1, dtype=dtype, scale=1.5 / math.sqrt(K))
    w_up = _randn(N, K, seed=seed + 2, dtype=dtype, scale=1.0 / math.sqrt(K))
    return x, w_gate, w_up


def _glu_mm_ref(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, act: str = "gelu_tanh") -> torch.Tensor:
    return REFS[act](x @ w_gate.T, x @ w_up.T)


# (a rows, K, N): up-projection shape, and the down projection 328 -> 96 (K=328 has a K tail).
MATMUL_SHAPES = [(111, 96, 328), (111, 328, 96)]


@triton.jit
def _geglu_erf_kernel(g_ptr, u_ptr, h_ptr, n, BLOCK: tl.constexpr):
    # Same structure as the real kernel but with the exact (erf) GELU instead of the tanh form.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476)) * u
    tl.store(h_ptr + offs, h, mask=mask)


class TestTritonOpsCompiled:
    """The kernels compiled for the GPU (runs where this process compiles them: CUDA)."""

    INTERPRET = False

    @pytest.fixture(autouse=True)
    def _this_process_mode(self) -> None:
        if INTERPRETED != self.INTERPRET:
            mode = "interprets" if INTERPRETED else "compiles"
            pytest.skip(
                f"this process {mode} its Triton kernels (chosen once, before triton was imported); "
                f"{type(self).__name__} runs where it {'interprets' if self.INTERPRET else 'compiles'} them"
            )

    # ---------------------------------------------------------------- elementwise kernels

    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_glu_forward(self, dtype: torch.dtype, act: str) -> None:
        g = _randn(1823, 781, seed=1, dtype=dtype, scale=2.0)
        u = _randn(1823, 781, seed=2, dtype=dtype)
        h = glu_forward(g, u, act)
        assert h.shape == g.shape and h.dtype == dtype
        ref = REFS[act](g.double(), u.double())
        assert_close(h, ref, REFS[act](g, u), dtype, f"glu_forward {act}")

    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_glu_backward(self, dtype: torch.dtype, act: str) -> None:
        g = _randn(1823, 781, seed=3, dtype=dtype, scale=2.0)
        u = _randn(1823, 781, seed=4, dtype=dtype)
        dh = _randn(1823, 781, seed=5, dtype=dtype)
        dg, du = glu_backward(dh, g, u, act)

        g64, u64 = g.double().requires_grad_(), u.double().requires_grad_()
        REFS[act](g64, u64).backward(dh.double())
        gt, ut = g.clone().requires_grad_(), u.clone().requires_grad_()
        REFS[act](gt, ut).backward(dh)

        assert_close(dg, g64.grad, gt.grad, dtype, f"glu_backward {act} dg")
        assert_close(du, u64.grad, ut.grad, dtype, f"glu_backward {act} du")

    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_glu_function_autograd(self, dtype: torch.dtype, act: str) -> None:
        g = _randn(3, 37, 41, seed=6, dtype=dtype, scale=2.0)
        u = _randn(3, 37, 41, seed=7, dtype=dtype)
        dh = _randn(3, 37, 41, seed=8, dtype=dtype)
        gk, uk = g.clone().requires_grad_(), u.clone().requires_grad_()
        h = glu(gk, uk, act)
        h.backward(dh)
        g64, u64 = g.double().requires_grad_(), u.double().requires_grad_()
        ref = REFS[act](g64, u64)
        ref.backward(dh.double())
        gt, ut = g.clone().requires_grad_(), u.clone().requires_grad_()
        out_t = REFS[act](gt, ut)
        out_t.backward(dh)
        assert_close(h.detach(), ref.detach(), out_t.detach(), dtype, f"glu {act}")
        assert_close(gk.grad, g64.grad, gt.grad, dtype, f"glu {act} dg")
        assert_close(uk.grad, u64.grad, ut.grad, dtype, f"glu {act} du")
        assert isinstance(h.grad_fn, GLUFunction._backward_cls)  # the graph node is ours

    def test_default_activation_is_gelu_tanh(self) -> None:
        """Without ``act`` the elementwise kernel is GeGLU's (the tanh-form GELU), bit for bit."""
        g = _randn(37, 41, seed=11, dtype=torch.float32, scale=2.0)
        u = _randn(37, 41, seed=12, dtype=torch.float32)
        assert torch.equal(glu_forward(g, u), glu_forward(g, u, "gelu_tanh"))

    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_each_activation_fails_the_others_reference(self, dtype: torch.dtype) -> None:
        """The kernels do switch activation: SiLU's output fails GELU's reference and vice versa, forward and
        backward, while each passes its own (odd shape, every dtype)."""
        g = _randn(257, 333, seed=13, dtype=dtype, scale=2.0)
        u = _randn(257, 333, seed=14, dtype=dtype)
        dh = _randn(257, 333, seed=15, dtype=dtype)
        for act, other in (("silu", "gelu_tanh"), ("gelu_tanh", "silu")):
            h = glu_forward(g, u, act)
            ok, msg = _compare(h, REFS[other](g.double(), u.double()), REFS[other](g, u), dtype)
            assert not ok, f"{act} kernel passed the {other} reference: {msg}"
            dg, _ = glu_backward(dh, g, u, act)
            g64 = g.double().requires_grad_()
            REFS[other](g64, u.double()).backward(dh.double())
            gt = g.clone().requires_grad_()
            REFS[other](gt, u).backward(dh)
            ok, msg = _compare(dg, g64.grad, gt.grad, dtype)
            assert not ok, f"{act} backward passed the {other} reference: {msg}"

    def test_silu_has_no_overflow_or_cancellation_at_extremes(self) -> None:
        """SiLU and its derivative at |g| up to 1e4 (exp(-g) overflows fp32 past 88): finite, and silu' -> 1 on the
        right (no 1 - sigmoid cancellation), -> 0 on the left; fp32 kernel against float64 torch."""
        g = torch.tensor([-1e4, -200.0, -90.0, -20.0, -1.0, 0.0, 1.0, 20.0, 90.0, 200.0, 1e4], device=DEVICE)
        u, dh = torch.ones_like(g), torch.ones_like(g)
        h = glu_forward(g, u, "silu")
        dg, du = glu_backward(dh, g, u, "silu")
        g64 = g.double().requires_grad_()
        F.silu(g64).backward(torch.ones_like(g64))
        assert torch.isfinite(h).all() and torch.isfinite(dg).all()
        torch.testing.assert_close(h.double(), F.silu(g.double()), rtol=1e-6, atol=1e-30)
        torch.testing.assert_close(dg.double(), g64.grad, rtol=1e-6, atol=1e-30)
        torch.testing.assert_close(du, h)

    def test_an_unknown_activation_is_refused(self) -> None:
        f32 = torch.zeros(4, 8, device=DEVICE)
        with pytest.raises(ValueError, match="unknown activation 'relu'; known: gelu_tanh, silu"):
            glu_forward(f32, f32, "relu")
        with pytest.raises(ValueError, match="unknown activation 'relu'"):
            glu_backward(f32, f32, f32, "relu")
        with pytest.raises(ValueError, match="unknown activation 'relu'"):
            glu_matmul(f32, torch.zeros(5, 8, device=DEVICE), torch.zeros(5, 8, device=DEVICE), "relu")
        with pytest.raises(ValueError, match="unknown activation 'relu'"):
            fused_glu(f32, torch.zeros(5, 8, device=DEVICE), torch.zeros(5, 8, device=DEVICE), "relu")

    def test_geglu_empty_and_noncontiguous(self) -> None:
        e = torch.empty(0, 5, device=DEVICE)
        assert glu_forward(e, e).shape == (0, 5)
        g = _randn(40, 33, seed=9, dtype=torch.float32).T  # non-contiguous view
        u = _randn(40, 33, seed=10, dtype=torch.float32).T
        ref = _geglu_ref(g.double(), u.double())
        assert_close(glu_forward(g, u), ref, _geglu_ref(g, u), torch.float32, "glu_forward (transposed)")

    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("shape", GEMM_SHAPES, ids=GEMM_IDS)
    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_glu_matmul(self, dtype: torch.dtype, shape, act: str) -> None:
        lead, K, N = shape
        x, w_gate, w_up = _gemm_inputs(lead, K, N, dtype, seed=20)
        h = glu_matmul(x, w_gate, w_up, act)
        assert h.shape == (*lead, N) and h.dtype == dtype
        ref = _glu_mm_ref(x.double(), w_gate.double(), w_up.double(), act)
        assert_close(h, ref, _glu_mm_ref(x, w_gate, w_up, act), dtype, f"glu_matmul {act}")

    @pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=["111x96->328", "111x328->96"])
    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_matmul(self, dtype: torch.dtype, shape) -> None:
        M, K, N = shape
        a = _randn(M, K, seed=30, dtype=dtype)
        b = _randn(N, K, seed=31, dtype=dtype, scale=1.0 / math.sqrt(K))
        c = matmul(a, b)
        assert c.shape == (M, N) and c.dtype == dtype
        assert_close(c, a.double() @ b.double().T, a @ b.T, dtype, "matmul")

    def test_gemm_noncontiguous_weights(self) -> None:
        x, w_gate, w_up = _gemm_inputs((33,), 40, 50, torch.float32, seed=40)
        wg_t = w_gate.T.contiguous().T  # same values, column-major strides
        assert not wg_t.is_contiguous()
        ref = _glu_mm_ref(x.double(), w_gate.double(), w_up.double())
        assert_close(glu_matmul(x, wg_t, w_up), ref, _glu_mm_ref(x, w_gate, w_up), torch.float32, "strided")
        assert_close(matmul(x, wg_t), x.double() @ w_gate.double().T, x @ w_gate.T, torch.float32, "strided mm")

    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
    def test_fused_glu_gradients(self, dtype: torch.dtype, act: str) -> None:
        lead, K, N = (3, 37), 96, 328
        x, w_gate, w_up = _gemm_inputs(lead, K, N, dtype, seed=50)
        dh = _randn(*lead, N, seed=53, dtype=dtype)

        leaves_k = [t.clone().requires_grad_() for t in (x, w_gate, w_up)]
        h = fused_glu(*leaves_k, act)
        assert h.shape == (*lead, N) and h.dtype == dtype
        assert isinstance(h.grad_fn.next_functions[0][0], GLUMatmulFunction._backward_cls)
        h.backward(dh)

        leaves_64 = [t.double().requires_grad_() for t in (x, w_gate, w_up)]
        ref = _glu_mm_ref(*leaves_64, act)
        ref.backward(dh.double())
        leaves_t = [t.clone().requires_grad_() for t in (x, w_gate, w_up)]
        out_t = _glu_mm_ref(*leaves_t, act)
        out_t.backward(dh)

        assert_close(h.detach(), ref.detach(), out_t.detach(), dtype, f"fused_glu {act}")
        for name, lk, l64, lt in zip(("dx", "dw_gate", "dw_up"), leaves_k, leaves_64, leaves_t, strict=True):
            assert_close(lk.grad, l64.grad, lt.grad, dtype, f"fused_glu {act} {name}")

    def test_bf16_outputs_round_to_nearest(self) -> None:
        # The interpreter's own fp32 -> bf16 cast truncates (about half the outputs would be 1 ulp
        # off); the kernels round to nearest even, like the GPU. Compare with torch's fp32 result
        # rounded once to bf16: only near-ties may differ (fp32 math differs in the last bits).
        g = _randn(123, 457, seed=70, dtype=torch.bfloat16, scale=2.0)
        u = _randn(123, 457, seed=71, dtype=torch.bfloat16)
        h = glu_forward(g, u)
        expected = _geglu_ref(g.float(), u.float()).bfloat16()
        assert (h != expected).float().mean().item() < 1e-3
        a = _randn(70, 96, seed=72, dtype=torch.bfloat16)
        b = _randn(90, 96, seed=73, dtype=torch.bfloat16, scale=0.1)
        c = matmul(a, b)
        assert (c != (a.float() @ b.float().T).bfloat16()).float().mean().item() < 1e-2

    # ---------------------------------------------------------------- validation and helpers

    def test_validation_errors(self) -> None:
        f32 = torch.zeros(4, 8)
        with pytest.raises(ValueError, match="same shape"):
            glu_forward(f32, torch.zeros(4, 9))
        with pytest.raises(ValueError, match="same dtype"):
            glu_forward(f32, f32.half())
        with pytest.raises(ValueError, match=r"unsupported dtype torch\.float64.*allowed: torch\.float32"):
            glu_forward(f32.double(), f32.double())
        with pytest.raises(ValueError, match=r"unsupported dtype torch\.int32"):
            glu_backward(*(torch.zeros(3, dtype=torch.int32),) * 3)
        with pytest.raises(ValueError, match=r"w_gate must have shape \[N, K\] with K"):
            glu_matmul(f32, torch.zeros(5, 7), torch.zeros(5, 7))
        with pytest.raises(ValueError, match="w_up and w_gate must have the same shape"):
            glu_matmul(f32, torch.zeros(5, 8), torch.zeros(6, 8))
        with pytest.raises(ValueError, match="dtype of x"):
            fused_glu(f32, torch.zeros(5, 8), torch.zeros(5, 8).bfloat16())
        with pytest.raises(ValueError, match=r"unsupported dtype torch\.float64"):
            matmul(f32.double(), torch.zeros(5, 8).double())

    def test_interpreted_helper(self, monkeypatch: pytest.MonkeyPatch) -> None:
        assert _triton_env.interpreted() is self.INTERPRET
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert _triton_env.interpreted() is False
        monkeypatch.delenv("TRITON_INTERPRET")
        assert _triton_env.interpreted() is False

    def test_negative_control_erf_gelu_fails_fp32(self) -> None:
        g = _randn(257, 333, seed=60, dtype=torch.float32, scale=2.0)
        u = _randn(257, 333, seed=61, dtype=torch.float32)
        h_erf = torch.empty_like(g)
        _geglu_erf_kernel[(triton.cdiv(g.numel(), 1 << 14),)](g, u, h_erf, g.numel(), BLOCK=1 << 14)
        # Sanity: the control kernel really computes erf GELU (so it is a GELU, just the wrong one) ...
        erf_ref = F.gelu(g.double(), approximate="none") * u.double()
        assert (h_erf.double() - erf_ref).abs().max().item() < 1e-5 * erf_ref.abs().max().item()
        # ... and the fp32 comparison against the tanh-form reference rejects it, while the real
        # kernel on the same inputs passes.
        ref = _geglu_ref(g.double(), u.double())
        torch_out = _geglu_ref(g, u)
        ok, msg = _compare(h_erf, ref, torch_out, torch.float32)
        assert not ok, f"erf GELU should fail the tanh-GELU fp32 check, but passed: {msg}"
        assert_close(glu_forward(g, u), ref, torch_out, torch.float32, "glu_forward (control inputs)")


class TestTritonOpsInterpreted(TestTritonOpsCompiled):
    """The same tests under Triton's CPU interpreter (runs where this process has no CUDA)."""

    INTERPRET = True
