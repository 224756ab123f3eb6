import os
from pathlib import Path

import pytest
import torch

import scaled_mask_softmax
from scaled_mask_softmax.reference import scaled_mask_softmax_reference

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
]


@pytest.fixture(autouse=True)
def subnormals_kept():
    """torch 2.5's inductor loads CPU code built with -ffast-math, whose start-up code turns on flush-to-zero for
    the whole process: the tests after a compiled one would see subnormals flushed (and hypothesis refuses then to
    draw floats)."""
    yield
    torch.set_flush_denormal(False)


# (atol, rtol) per dtype for outputs in [0, 1] and for gradients of randn-sized dy: about one rounding of the
# result in that dtype (bf16 keeps 8 significant bits, fp16 11), fp32 a few ulps.
TOLERANCES = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (2e-6, 2e-5),
    torch.float16: (1e-3, 2e-3),
    torch.bfloat16: (8e-3, 1.6e-2),
}


def assert_close_to(actual, expected, dtype, scale=1.0):
    """`actual` (any dtype/device) within dtype's tolerance of the float64 `expected`, scaled by `scale`."""
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach().cpu().double(),
                               atol=atol * scale, rtol=rtol, equal_nan=True)


# Half an ulp of 1: a 16-bit result's rounding, which bounds its error where fp32 accumulation makes the rest small.
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
ROUNDINGS = 4


def assert_16_bit_softmax_close(y, dx, y_ref, dx_ref, dy, dtype, scale):
    """16-bit y and dx against the float64 reference, element by element, in units of what their roundings can
    move them: y_i by its own rounding, dx_i = scale * y_i * (dy_i - sum(dy * y)) by y's and its own, so within
    u * |scale| * y_i * (|dy_i| + sum(y |dy|)). A fixed atol would let a long row's probabilities (about 1/n) and
    gradients be anything; a bound in units of |dx| would fail gradients that cancel."""
    u = ROUNDINGS * UNIT_ROUNDOFF[dtype]
    # Subnormal results round in steps of the smallest subnormal (fp16's probabilities below 6.1e-5, which dx then
    # reads), and below fp32's normal range they come out 0 (README).
    step = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    smallest = max(ROUNDINGS * step, 1.2e-38)
    y, dx, y_ref, dx_ref, dy = (t.detach().cpu().double() for t in (y, dx, y_ref, dx_ref, dy))
    torch.testing.assert_close(y, y_ref, atol=smallest, rtol=u, equal_nan=True)
    y_read = y_ref + step / UNIT_ROUNDOFF[dtype]  # y as dx reads it: rounded, subnormal steps included
    magnitude = y_read * (dy.abs() + (y_read * dy.abs()).sum(-1, keepdim=True))
    assert torch.equal(dx.isnan(), dx_ref.isnan()), "dx is NaN elsewhere than the reference's"
    error = (dx - dx_ref).abs().nan_to_num(0.0)
    bound = u * abs(scale) * magnitude.nan_to_num(0.0) + smallest
    worst = (error / bound).max().item() if error.numel() else 0.0
    assert worst <= 1, f"dx off by {worst:.2f} times its bound, {u} * |scale| * y * (|dy| + sum(y |dy|))"


def reference_forward_backward(x, mask, scale, is_causal, causal_variant, dy):
    """float64 reference output and gradients (x, and the mask when floating) on the CPU."""
    x64 = x.detach().cpu().double().requires_grad_()
    mask64 = None
    if mask is not None:
        mask64 = mask.detach().cpu()
        if mask64.is_floating_point():
            mask64 = mask64.double().requires_grad_()
    y = scaled_mask_softmax_reference(x64, mask64, scale, is_causal, causal_variant)
    y.backward(dy.detach().cpu().double())
    # A fully masked row has zero gradient by contract; autograd through masked_fill already gives that.
    return y, x64.grad, (mask64.grad if mask64 is not None and mask64.requires_grad else None)


def random_scores(shape, dtype, device, generator_seed=0):
    generator = torch.Generator().manual_seed(generator_seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * 2).to(dtype).to(device)


def environment_importing_this_package(**settings):
    """os.environ, with `settings`, for a child process that imports the package this one imported, installed or not
    (a tree built in place)."""
    package_root = str(Path(scaled_mask_softmax.__file__).resolve().parents[1])
    return {**os.environ, **settings,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
