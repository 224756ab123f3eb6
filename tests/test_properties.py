"""Properties over random shapes, dtypes, masks, layouts and scales; edge values; determinism on the CPU."""
import dataclasses
import math
import os
from typing import Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scaled_mask_softmax as sms
from conftest import DEVICES, TOLERANCES, assert_close_to, random_scores, reference_forward_backward

# The default run draws the same examples every time (CI reproduces any failure) and keeps this file under a
# minute on two CPU cores; SCALED_MASK_SOFTMAX_FUZZ_EXAMPLES=2000 explores fresh examples, e.g. on a GPU machine.
FUZZ_EXAMPLES = os.environ.get("SCALED_MASK_SOFTMAX_FUZZ_EXAMPLES")
if FUZZ_EXAMPLES:
    settings.register_profile("fuzz", max_examples=int(FUZZ_EXAMPLES), deadline=None, print_blob=True)
    settings.load_profile("fuzz")
else:
    settings.register_profile("bounded", max_examples=200, deadline=None, derandomize=True)
    settings.load_profile("bounded")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
MAX_ELEMENTS = 200_000  # per example, so that each runs in milliseconds on the CPU
INF = float("inf")
NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn example; its repr is what hypothesis prints for a failure."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str                              # contiguous, transposed, sliced or strided
    transposed_dims: tuple[int, int]         # the two outer dims swapped when layout == "transposed"
    slice_start: int                         # first column of the slice when layout == "sliced"
    mask_kind: str                           # none, bool, additive (x's dtype) or float32
    mask_shape: tuple[int, ...]
    masked_fraction: float                   # chance that a mask element masks its position
    fully_masked_fraction: float             # chance that a row of the mask masks every key
    mask_requires_grad: bool
    causal_variant: Optional[str]            # None: not causal
    scale: float
    seed: int


# Mostly short rows (many rows per warp on CUDA), some up to the register-resident block path, now and then past
# 16384 columns, where CUDA rows take the two-pass kernels (on sm_90 split over the blocks of a cluster). The tiers are weighted 6 : 3 : 1 by repetition (st.one_of would drop the repeats).
SHORT_ROWS, MEDIUM_ROWS, LONG_ROWS = st.integers(1, 64), st.integers(65, 5000), st.integers(16385, 70000)
ROW_LENGTHS = st.sampled_from([SHORT_ROWS] * 6 + [MEDIUM_ROWS] * 3 + [LONG_ROWS]).flatmap(lambda lengths: lengths)
SCALES = st.one_of(
    st.floats(-4.0, 4.0),
    st.sampled_from([0.0, 1e-30, -1e-6, 0.125, -0.5, 30.0, -100.0, 1000.0]),
)


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 5))
    cols = draw(ROW_LENGTHS)
    outer = []
    for _ in range(rank - 1):
        room = MAX_ELEMENTS // (cols * math.prod(outer))
        outer.append(draw(st.integers(1, min(7, room))))
    shape = (*outer, cols)

    layouts = ["contiguous", "sliced", "strided"] + (["transposed"] if rank >= 3 else [])
    layout = draw(st.sampled_from(layouts))
    transposed_dims = (0, 0)
    if layout == "transposed":
        transposed_dims = tuple(draw(st.permutations(range(rank - 1)))[:2])
    slice_start = draw(st.integers(0, 3)) if layout == "sliced" else 0

    mask_kind = draw(st.sampled_from(["none", "bool", "additive", "float32"]))
    kept_dims = draw(st.integers(0, rank))
    mask_shape = tuple(size if draw(st.booleans()) else 1 for size in shape[rank - kept_dims:])

    return Case(
        shape=shape,
        dtype=draw(st.sampled_from(DTYPES)),
        layout=layout,
        transposed_dims=transposed_dims,
        slice_start=slice_start,
        mask_kind=mask_kind,
        mask_shape=mask_shape,
        masked_fraction=draw(st.sampled_from([0.0, 0.2, 0.9])),
        fully_masked_fraction=draw(st.sampled_from([0.0, 0.3])),
        mask_requires_grad=mask_kind in ("additive", "float32") and draw(st.booleans()),
        causal_variant=draw(st.sampled_from([None, "upper_left", "lower_right"])) if rank >= 2 else None,
        scale=draw(SCALES),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_x(case, generator, device):
    """x of `case.shape` in `case.layout`, a view of a larger or permuted contiguous tensor."""
    def scores(shape):
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * 2).to(case.dtype).to(device)

    if case.layout == "transposed":
        first, second = case.transposed_dims
        permuted = list(case.shape)
        permuted[first], permuted[second] = permuted[second], permuted[first]
        return scores(permuted).transpose(first, second)
    if case.layout == "sliced":
        cols = case.shape[-1]
        return scores((*case.shape[:-1], cols + 3))[..., case.slice_start:case.slice_start + cols]
    if case.layout == "strided":
        return scores((*case.shape[:-1], 2 * case.shape[-1]))[..., ::2]
    return scores(case.shape)


def make_mask(case, generator, device):
    if case.mask_kind == "none":
        return None
    mask_rows = math.prod(case.mask_shape[:-1])
    mask_cols = case.mask_shape[-1] if case.mask_shape else 1
    masked = torch.rand((mask_rows, mask_cols), generator=generator) < case.masked_fraction
    masked[torch.rand(mask_rows, generator=generator) < case.fully_masked_fraction] = True
    masked = masked.reshape(case.mask_shape)
    if case.mask_kind == "bool":
        return (~masked).to(device)
    mask_dtype = case.dtype if case.mask_kind == "additive" else torch.float32
    values = torch.randn(case.mask_shape, generator=generator, dtype=torch.float64).masked_fill(masked, -INF)
    return values.to(mask_dtype).to(device).requires_grad_(case.mask_requires_grad)


def compute_dtype_of(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def score_rounding_allowance(x, mask, scale):
    """Factor on the atol for the scores being formed in fp32 (fp64 for fp64), not in the reference's float64.

    Rounding the scale, the product and the mask sum moves each score by up to 1.5 eps of the largest score, and
    that moves y by up to twice as much; negligible for unit scores, it dominates with a scale of 1000.
    """
    largest = abs(scale) * x.detach().abs().max().item()
    if mask is not None and mask.is_floating_point():
        finite = mask.detach()[mask.isfinite()]
        largest += finite.abs().max().item() if finite.numel() else 0.0
    atol = TOLERANCES[x.dtype][0]
    return 1 + 3 * torch.finfo(compute_dtype_of(x.dtype)).eps * largest / atol


@pytest.mark.parametrize("device", DEVICES)
@given(case=cases())
def test_matches_reference(device, case):
    """Forward and backward (x and a learnable mask) against the float64 reference, fully masked rows as zeros."""
    generator = torch.Generator().manual_seed(case.seed)
    x = make_x(case, generator, device).requires_grad_()
    mask = make_mask(case, generator, device)
    dy = torch.randn(case.shape, generator=generator, dtype=torch.float64).to(case.dtype).to(device)
    is_causal = case.causal_variant is not None
    causal_variant = case.causal_variant or "upper_left"
    before = x.detach().clone()

    y = sms.scaled_mask_softmax(x, mask, case.scale, is_causal, causal_variant)
    y.backward(dy)

    y_ref, dx_ref, dmask_ref = reference_forward_backward(x, mask, case.scale, is_causal, causal_variant, dy)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert torch.equal(x.detach(), before)
    allowance = score_rounding_allowance(x, mask, case.scale)
    assert_close_to(y, y_ref, case.dtype, scale=allowance)
    gradient_scale = 4 * max(1.0, abs(case.scale)) * allowance
    assert_close_to(x.grad, dx_ref, case.dtype, scale=gradient_scale)
    if case.mask_requires_grad:
        # Summed over broadcast dims: the error grows with the number of terms summed. The gradient is in the
        # mask's dtype, so a float32 mask under float64 scores gets float32's tolerance.
        terms = x.numel() // mask.numel()
        coarser = max(case.dtype, mask.dtype, key=lambda dtype: torch.finfo(dtype).eps)
        assert_close_to(mask.grad, dmask_ref, coarser, scale=gradient_scale * terms)


@st.composite
def batched_calls(draw):
    """x and its mask for a vmapped call: each batched at any of its dims or not batched (not both unbatched)."""
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(rank - 1)) + (draw(st.integers(1, 40)),)
    mask_kind = draw(st.sampled_from(["none", "bool", "float32"]))
    kept_dims = draw(st.integers(0, rank))
    mask_shape = tuple(size if draw(st.booleans()) else 1 for size in shape[rank - kept_dims:])
    x_dim = draw(st.sampled_from([None, *range(rank + 1)]))
    mask_dim = None if mask_kind == "none" else draw(st.sampled_from([None, *range(len(mask_shape) + 1)]))
    if x_dim is None and mask_dim is None:
        x_dim = 0
    causal_variant = draw(st.sampled_from([None, "upper_left", "lower_right"])) if rank >= 2 else None
    return shape, mask_kind, mask_shape, x_dim, mask_dim, causal_variant, draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("device", DEVICES)
@given(call=batched_calls())
def test_vmap_matches_a_call_per_sample(device, call):
    # The batching rules (the forward's and, through y and dy, the backward's) against one call per sample.
    shape, mask_kind, mask_shape, x_dim, mask_dim, causal_variant, seed = call
    generator = torch.Generator().manual_seed(seed)
    options = (0.7, causal_variant is not None, causal_variant or "upper_left")
    batch = 3

    def batched(sample_shape, dim):
        if dim is None:
            return torch.randn(sample_shape, generator=generator).to(device)
        return torch.randn((batch, *sample_shape), generator=generator).movedim(0, dim).to(device)

    def sample(tensor, dim, index):
        return tensor if dim is None else tensor.select(dim, index)

    x = batched(shape, x_dim)
    mask = None if mask_kind == "none" else batched(mask_shape, mask_dim)
    if mask_kind == "bool":
        mask = mask > -0.5
    ys = torch.func.vmap(lambda a, m: sms.scaled_mask_softmax(a, m, *options), in_dims=(x_dim, mask_dim))(x, mask)
    expected = torch.stack([sms.scaled_mask_softmax(sample(x, x_dim, i), sample(mask, mask_dim, i), *options)
                            for i in range(batch)])
    torch.testing.assert_close(ys, expected)

    dy = batched(shape, None)
    dxs = torch.func.vmap(lambda y: torch.ops.scaled_mask_softmax.backward(y, dy, *options))(ys)
    torch.testing.assert_close(dxs, torch.stack([torch.ops.scaled_mask_softmax.backward(y, dy, *options) for y in ys]))


def torch_softmax_forward_backward(x, scale, dy, is_causal=False):
    """torch.softmax on the scores formed as the operator forms them (fp32, fp64 for fp64), and its x gradient."""
    x_scores = x.detach().cpu().to(compute_dtype_of(x.dtype)).requires_grad_()
    scores = x_scores * scale
    if is_causal:
        visible = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, -INF)
    y = torch.softmax(scores, dim=-1)
    y.backward(dy.detach().cpu().to(y.dtype))
    return y, x_scores.grad


def forward_backward(x, mask=None, scale=1.0, is_causal=False, dy=None):
    x = x.detach().requires_grad_()
    y = sms.scaled_mask_softmax(x, mask, scale, is_causal)
    dy = random_scores(x.shape, x.dtype, x.device, generator_seed=1) if dy is None else dy
    y.backward(dy)
    return y, x.grad, dy


@pytest.mark.parametrize("device", DEVICES)
def test_float16_scores_beyond_float16_range(device):
    """x * scale (+ mask) past fp16's largest value (65504) but inside fp32's: the operator forms scores in fp32,
    so it matches the float64 reference where a float16 composite (x * scale in fp16) would give inf and NaN."""
    x = torch.tensor([[60000.0, 60000.0, 59968.0, -60000.0],      # near the fp16 maximum, scale 1
                      [60000.0, 59000.0, 30000.0, 0.0],           # times 4: 240000 overflows fp16
                      [1.0, 0.5, 0.0, -1.0]], dtype=torch.float16, device=device)
    for scale in (1.0, 4.0, -4.0):
        y, dx, dy = forward_backward(x, scale=scale)
        y_ref, dx_ref, _ = reference_forward_backward(x, None, scale, False, "upper_left", dy)
        assert_close_to(y, y_ref, torch.float16)
        assert_close_to(dx, dx_ref, torch.float16, scale=4 * abs(scale))
    mask = torch.tensor([60000.0, 0.0, 0.0, 60000.0], dtype=torch.float16, device=device)
    y, _, dy = forward_backward(x, mask)
    y_ref, _, _ = reference_forward_backward(x, mask, 1.0, False, "upper_left", dy)
    assert_close_to(y, y_ref, torch.float16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [37, 1024])
@pytest.mark.parametrize("offset", [60000.0, -60000.0, 70000.0, -70000.0, -1e30])
def test_scores_far_from_zero(device, dtype, cols, offset):
    """Every score of a row near one large value, in x or in a float32 mask: the softmax of the scores as formed
    in fp32, to fp32's tolerance (the reference, from exact scores, would need a large allowance here). Either side
    of 65536, where exp(s - max) formed as one fma of s and max * log2(e) stops being exact enough."""
    generator = torch.Generator().manual_seed(cols)
    noise = torch.randn(4, cols, generator=generator, dtype=torch.float64)
    for x, mask in (((offset + noise).to(dtype), None),
                    (noise.to(dtype), torch.full((4, cols), offset, dtype=torch.float32))):
        scores = x.float() if mask is None else x.float() + mask
        expected = torch.softmax(scores.double(), dim=-1)
        y = sms.scaled_mask_softmax(x.to(device), None if mask is None else mask.to(device))
        assert_close_to(y, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [5, 3000, 20000])
def test_negative_infinity_in_x_is_masked(device, dtype, cols):
    """-inf in x with a positive scale is a masked position: a row of only -inf gives zeros (and zero gradient),
    the fully masked policy; a row with some -inf matches torch.softmax and the reference."""
    x = random_scores((3, cols), dtype, "cpu")
    x[0] = -INF
    x[1, ::2] = -INF
    x = x.to(device)
    y, dx, dy = forward_backward(x, scale=0.5)
    y_ref, dx_ref, _ = reference_forward_backward(x, None, 0.5, False, "upper_left", dy)
    assert_close_to(y, y_ref, dtype)
    assert_close_to(dx, dx_ref, dtype, scale=4)
    assert torch.equal(y[0].cpu().float(), torch.zeros(cols))
    assert torch.equal(dx[0].cpu().float(), torch.zeros(cols))
    y_torch, _ = torch_softmax_forward_backward(x, 0.5, dy)
    assert_close_to(y[1], y_torch[1], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [5, 3000, 20000])
def test_infinity_and_nan_give_nan_rows_as_torch_softmax(device, dtype, cols):
    """+inf or NaN among a row's scores makes the whole row NaN, forward and backward, exactly as torch.softmax
    does on the same fp32 scores; so does -inf with a negative scale (it becomes +inf). Other rows are unaffected."""
    x = random_scores((6, cols), dtype, "cpu")
    x[1, cols // 2] = INF
    x[2, cols // 3] = NAN
    x[3] = -INF
    x[3, 0] = INF                  # +inf among -inf
    x[4] = NAN
    x[5, -1] = -INF                # +inf once scaled by -1, while row 1's +inf becomes -inf
    x = x.to(device)
    for scale, nan_rows in ((1.0, [1, 2, 3, 4]), (-1.0, [2, 3, 4, 5])):
        y, dx, dy = forward_backward(x, scale=scale)
        y_torch, dx_torch = torch_softmax_forward_backward(x, scale, dy)
        assert_close_to(y, y_torch, dtype)
        assert_close_to(dx, dx_torch, dtype, scale=4)
        assert y[nan_rows].isnan().all() and dx[nan_rows].isnan().all()
        finite_rows = [row for row in range(6) if row not in nan_rows]
        assert y[finite_rows].isfinite().all() and dx[finite_rows].isfinite().all()


# Rows of 3000 columns and more: four queries see at most four keys, and the GPU narrows them to their first 64
# columns, writing the rest of y and dx apart (at 16,383 fp32 columns in 2-byte words).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, cols", [(torch.float32, 5), (torch.float32, 3000), (torch.float32, 16384),
                                         (torch.float32, 16383), (torch.bfloat16, 16384)])
def test_causal_row_with_nan_is_nan_everywhere(device, dtype, cols):
    """With is_causal, a row whose visible scores hold +inf or NaN is NaN at every position, the hidden ones
    included, as torch.softmax gives after filling the hidden scores with -inf. Its gradient is NaN at the
    visible keys and 0 at the hidden ones, as the composite's masked_fill passes back. Other rows are untouched."""
    x = random_scores((4, cols), dtype, "cpu")
    x[1, 0] = INF
    x[2, 1] = NAN
    x = x.to(device)
    y, dx, dy = forward_backward(x, is_causal=True)
    y_torch, dx_torch = torch_softmax_forward_backward(x, 1.0, dy, is_causal=True)
    assert_close_to(y, y_torch, dtype)
    assert torch.equal(dx.isnan().cpu(), dx_torch.isnan().cpu()) and dx[1:3].isnan().any()
    assert not dx[1:3].nan_to_num().any()
    assert_close_to(dx[[0, 3]], dx_torch[[0, 3]], dtype, scale=4)


@pytest.mark.parametrize("device", DEVICES)
def test_long_float32_rows_sum_within_float32_tolerance(device):
    """A row of 20000 exponentials, most far smaller than their running sum, still sums within fp32's tolerance
    (added one by one in fp32, the sum comes out about 4e-5 low, twice fp32's rtol)."""
    x = random_scores((8, 20000), torch.float32, device)
    y_ref = sms.scaled_mask_softmax_reference(x.cpu(), scale=2.0)
    assert_close_to(sms.scaled_mask_softmax(x, scale=2.0), y_ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_mask_applies_to_every_score(device):
    """A 0-d mask broadcasts as any other: one bool for every position, or one value added to every score."""
    x = random_scores((3, 7), torch.float32, device)
    for mask in (torch.tensor(True), torch.tensor(False), torch.tensor(0.5), torch.tensor(-INF)):
        y_ref, _, _ = reference_forward_backward(x, mask, 1.0, False, "upper_left", torch.zeros_like(x))
        assert_close_to(sms.scaled_mask_softmax(x, mask.to(device)), y_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(512, 100), (2, 4, 24, 3000), (6, 20000)])
def test_cpu_bitwise_deterministic(dtype, shape):
    """Repeated runs, and a run on one thread, give the same bits: each row is reduced by one thread, in order."""
    x = random_scores(shape, dtype, "cpu")
    mask = random_scores((shape[-1],), dtype, "cpu", generator_seed=2)
    mask[::5] = -INF
    dy = random_scores(shape, dtype, "cpu", generator_seed=1)

    def forward_backward_bits():
        y, dx, _ = forward_backward(x, mask, scale=0.3, is_causal=True, dy=dy)
        return y, dx

    first_y, first_dx = forward_backward_bits()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        runs = [forward_backward_bits()]
    finally:
        torch.set_num_threads(threads)
    runs += [forward_backward_bits() for _ in range(3)]
    for y, dx in runs:
        assert torch.equal(y, first_y) and torch.equal(dx, first_dx)
