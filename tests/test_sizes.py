"""Sizes at the edges: many rows of 1 to 3 columns, rows up to 1,048,576 columns, empty tensors with masks, and
more than 2^31 elements (64-bit indexing)."""
import gc

import pytest
import torch

import scaled_mask_softmax as sms
from conftest import DEVICES, TOLERANCES, assert_close_to, random_scores, reference_forward_backward


def assert_close_on_long_row(actual, expected, dtype, cols, gradient=False):
    """Against the float64 reference, for rows too long for the fixed tolerances: probabilities are about
    1/cols, so atol shrinks with the row and rtol decides; the row sum of cols terms in fp32 rounds like
    sqrt(cols) ulps (a random walk), which rtol allows for."""
    atol, rtol = TOLERANCES[dtype]
    if gradient:
        atol *= 4
    rtol = max(rtol, cols ** 0.5 * torch.finfo(torch.float32).eps)
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach().cpu().double(),
                               atol=atol / cols, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [1, 2, 3])
def test_many_tiny_rows(device, cols):
    # On CUDA many rows share a warp; 4099 rows leave the last warp partly filled. A random bool mask masks
    # some rows entirely (zeros by contract).
    x = random_scores((4099, cols), torch.float32, device).requires_grad_()
    mask = (torch.rand((4099, cols), generator=torch.Generator().manual_seed(2)) > 0.3).to(device)
    dy = random_scores(x.shape, torch.float32, device, generator_seed=1)
    y = sms.scaled_mask_softmax(x, mask, 0.7)
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, mask, 0.7, False, "upper_left", dy)
    assert_close_to(y, y_ref, torch.float32)
    assert_close_to(x.grad, dx_ref, torch.float32, scale=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cols", [131073, 1048576])
def test_long_rows(device, cols):
    # Longer than test_contract's rows; on CUDA the two-pass kernel, an odd length read element by element.
    x = random_scores((2, cols), torch.float32, device).requires_grad_()
    mask = torch.zeros(cols, device=device)
    mask[::5] = float("-inf")
    dy = random_scores(x.shape, torch.float32, device, generator_seed=1)
    y = sms.scaled_mask_softmax(x, mask, 0.3)
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, mask, 0.3, False, "upper_left", dy)
    assert_close_on_long_row(y, y_ref, torch.float32, cols)
    assert_close_on_long_row(x.grad, dx_ref, torch.float32, cols, gradient=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(0, 4, 8, 8), (2, 0, 8, 8), (2, 4, 0, 8), (2, 4, 8, 0), (0, 0, 0, 0)])
@pytest.mark.parametrize("mask_kind", ["bool_padding", "learnable_bias"])
def test_empty_tensors_with_masks(device, dtype, shape, mask_kind):
    x = torch.empty(shape, dtype=dtype, device=device, requires_grad=True)
    if mask_kind == "bool_padding":
        mask = torch.ones(shape[0], 1, 1, shape[-1], dtype=torch.bool, device=device)
    else:
        mask = torch.zeros(shape[-2:], dtype=dtype, device=device, requires_grad=True)
    y = sms.scaled_mask_softmax(x, mask, 0.5, is_causal=True, causal_variant="lower_right")
    assert y.shape == x.shape and y.dtype == dtype
    y.sum().backward()
    assert x.grad.shape == x.shape
    if mask.requires_grad:
        assert torch.equal(mask.grad, torch.zeros_like(mask))


@pytest.fixture
def release_cuda_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def sampled_forward_backward(shape, padding_lengths, sampled_rows):
    """Forward and backward on a bf16 `[B, 1, Sq, Sk]` with a key-padding mask; returns x, mask, dy, y and dx
    of the sampled rows (on the CPU) and whether y or dx holds a NaN anywhere. The big tensors die on return."""
    batch, queries, cols = shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((batch, 1, queries, cols), generator=generator, dtype=torch.bfloat16, device="cuda")
    x.requires_grad_()
    dy = torch.randn(x.shape, generator=generator, dtype=torch.bfloat16, device="cuda")
    mask = torch.ones(batch, 1, 1, cols, dtype=torch.bool, device="cuda")
    for item, padding in enumerate(padding_lengths):
        mask[item, ..., cols - padding:] = False
    y = sms.scaled_mask_softmax(x, mask, 0.5)
    (dx,) = torch.autograd.grad(y, x, dy)
    has_nan = bool(torch.isnan(y).any()) or bool(torch.isnan(dx).any())
    rows = [tensor.detach().view(-1, cols)[sampled_rows].cpu() for tensor in (x, dy, y, dx)]
    row_masks = mask.view(batch, cols)[[row // queries for row in sampled_rows]].cpu()
    return rows, row_masks, has_nan


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(3, 43691, 16384), (3, 10923, 65536)])  # a block per row; two passes over slices
def test_more_than_2_to_the_31_elements(shape, release_cuda_memory):
    batch, queries, cols = shape
    elements = batch * queries * cols
    assert (batch * queries - 1) * cols == 2**31
    # x, dy, y, dx in bf16, and a bool for the NaN check.
    needed_bytes = 4 * 2 * elements + elements
    free_bytes, _ = torch.cuda.mem_get_info()
    if free_bytes < needed_bytes:
        pytest.skip(f"needs {needed_bytes / 2**30:.1f} GiB of free GPU memory, {free_bytes / 2**30:.1f} GiB free")
    rows = batch * queries
    # First, middle and last row; the last starts at element 2^31, past any 32-bit offset.
    sampled_rows = [0, rows // 2, rows - 1]
    (x, dy, y, dx), masks, has_nan = sampled_forward_backward(shape, [0, 1000, cols // 2 + 3], sampled_rows)
    assert not has_nan
    y_ref, dx_ref, _ = reference_forward_backward(x, masks, 0.5, False, "upper_left", dy)
    assert_close_on_long_row(y, y_ref, torch.bfloat16, cols)
    assert_close_on_long_row(dx, dx_ref, torch.bfloat16, cols, gradient=True)
