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
