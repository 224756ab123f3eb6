"""The operator's contract, on every device, against the float64 reference."""
import subprocess
import sys

import pytest
import torch

import scaled_mask_softmax as sms
from scaled_mask_softmax import _transforms
from conftest import (DEVICES, UNIT_ROUNDOFF, assert_16_bit_softmax_close, assert_close_to,
                      environment_importing_this_package, random_scores, reference_forward_backward)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

# Row lengths and the CUDA branch each reaches (16-bit types read 8-element vectors, fp32 4, fp64 2; rows of a
# length that is not a multiple of the vector start mid-vector, and are read from the vector boundary before each,
# spanning a vector more, in fp64 element by element):
#   1..128 vectors: a group of 1..32 lanes per row, up to 4 vectors per lane (many rows per warp; up to 2 a lane
#   in the forward below 9 vectors and the causal backward below 17, and in the backward without a causal limit
#   below 65 vectors, and 2 a thread in the blocks that follow);
#   129..256 vectors: one warp per row, 5..8 vectors a lane (1000 and 1024 in fp32, 2048 in 16 bits);
#   then one block per row with the row in registers, up to 16384 columns (4096 element by element), the max and
#   sum reduced at once from blocks of 256 threads (rows of over 896 vectors);
#   beyond: two passes, one block per row; on sm_90 a row without a causal limit is split over the blocks of a
#   cluster, a slice each, once it is longer than 4096 vectors (20000: two blocks in fp32, eight element by element).
# No causal limit, and each variant of one.
CAUSAL_LIMITS = pytest.mark.parametrize("is_causal, variant", [(False, "upper_left"), (True, "upper_left"),
                                                               (True, "lower_right")],
                                        ids=["not_causal", "upper_left", "lower_right"])
ROW_LENGTHS = [1, 2, 3, 7, 8, 31, 32, 33, 64, 100, 256, 257, 1000, 1024, 2048, 2056, 4096, 5001, 8200, 16384, 16392,
               20000]


def run(x, mask=None, scale=1.0, is_causal=False, causal_variant="upper_left", dy=None, check_mask_grad=False):
    """Forward and backward through the operator, both compared with the float64 reference."""
    x = x.detach().requires_grad_()
    if check_mask_grad:
        mask = mask.detach().requires_grad_()
    y = sms.scaled_mask_softmax(x, mask, scale, is_causal, causal_variant)
    dy = random_scores(x.shape, x.dtype, x.device, generator_seed=1) if dy is None else dy
    y.backward(dy)
    y_ref, dx_ref, dmask_ref = reference_forward_backward(x, mask, scale, is_causal, causal_variant, dy)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    if x.dtype in UNIT_ROUNDOFF:
        assert_16_bit_softmax_close(y, x.grad, y_ref, dx_ref, dy, x.dtype, scale)
    assert_close_to(y, y_ref, x.dtype)
    gradient_scale = 4 * max(1.0, abs(scale))
    assert_close_to(x.grad, dx_ref, x.dtype, scale=gradient_scale)
    if check_mask_grad:
        # Summed over broadcast dims: the error grows with the number of terms summed; and it is rounded to the
        # mask's dtype, which may be coarser than x's.
        terms = x.numel() // mask.numel()
        coarser = max(x.dtype, mask.dtype, key=lambda dtype: torch.finfo(dtype).eps)
        assert_close_to(mask.grad, dmask_ref, coarser, scale=gradient_scale * terms)
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", ROW_LENGTHS)
def test_row_lengths(device, dtype, cols):
    rows = 3 if cols > 4096 else 5
    run(random_scores((rows, cols), dtype, device), scale=0.7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
# Rows of a group of lanes, of a warp, of four warps (4096 in 16 bits), of a block of 384 threads, which reduces
# its max and sum at once, and of whole blocks of a cluster.
@pytest.mark.parametrize("cols", [64, 37, 3000, 4096, 12000, 20000])
@pytest.mark.parametrize("mask_form", ["keys", "query_keys", "padding", "padding_bool", "heads_bias", "full",
                                       "full_bool", "expanded", "float32_bias", "key_column"])
def test_mask_forms(device, dtype, cols, mask_form):
    batch, heads, queries = 2, 3, 4
    if cols == 20000:
        batch, heads = 1, 2
    x = random_scores((batch, heads, queries, cols), dtype, device)
    generator = torch.Generator().manual_seed(2)

    def additive(shape, mask_dtype=dtype):
        values = torch.randn(shape, generator=generator, dtype=torch.float64)
        values[torch.rand(shape, generator=generator) < 0.2] = float("-inf")
        return values.to(mask_dtype).to(device)

    def attend(shape):
        return (torch.rand(shape, generator=generator) > 0.3).to(device)

    mask = {
        "keys": lambda: additive((cols,)),
        "query_keys": lambda: additive((queries, cols)),
        "padding": lambda: additive((batch, 1, 1, cols)),
        "padding_bool": lambda: attend((batch, 1, 1, cols)),
        "heads_bias": lambda: additive((1, heads, queries, cols)),
        "full": lambda: additive((batch, heads, queries, cols)),
        "full_bool": lambda: attend((batch, heads, queries, cols)),
        "expanded": lambda: additive((batch, 1, queries, cols)).expand(batch, heads, queries, cols),
        "float32_bias": lambda: additive((1, heads, queries, cols), torch.float32),
        "key_column": lambda: additive((batch, heads, queries, 1)),
    }[mask_form]()
    run(x, mask, scale=0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal_variant", ["upper_left", "lower_right"])
# On CUDA, causal rows of 9000 columns take two passes in fp32, of 17000 in every dtype; 16-bit rows at 17000 take
# one shape of the two-pass kernel upper-left (three queries: mostly hidden) and another lower-right. Rows of 32, 64
# and 128 columns: the shortest causal rows, which the backward holds at two vectors a thread up to 8 vectors (16-bit
# rows of 64 columns) and at four past them (fp32 rows of 64 columns).
@pytest.mark.parametrize("queries,cols", [(5, 5), (3, 8), (8, 3), (1, 1), (5, 32), (6, 64), (7, 128), (4, 1031),
                                          (6, 2048), (3, 9000), (3, 17000)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_causal(device, dtype, causal_variant, queries, cols, with_mask):
    x = random_scores((2, queries, cols), dtype, device)
    mask = None
    if with_mask:
        mask = torch.zeros(2, 1, cols, dtype=dtype)
        mask[0, 0, cols // 2:] = float("-inf")
        mask = mask.to(device)
    run(x, mask, scale=1.3, is_causal=True, causal_variant=causal_variant)


def hidden_keys(queries, cols, causal_variant, device):
    """True where the causal limit hides key j from query i."""
    visible = torch.ones(queries, cols, dtype=torch.bool).tril(cols - queries if causal_variant == "lower_right" else 0)
    return ~visible.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal_variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("queries, cols", [(6, 9), (8, 49), (6, 1032), (6, 17000)])
def test_causal_passes_ignore_hidden_keys(device, dtype, causal_variant, queries, cols):
    # Whatever x, the mask, y and dy hold past a row's visible keys (NaN, +inf), y and dx are what they are without
    # them, and dx is 0 there. 16 rows of 49 columns: whole flat runs, which causal rows do not take.
    x = random_scores((2, queries, cols), dtype, device)
    mask = random_scores((queries, cols), dtype, device, generator_seed=1)
    hidden = hidden_keys(queries, cols, causal_variant, device)
    y = sms.scaled_mask_softmax(x, mask, 0.5, True, causal_variant)
    x_garbage, mask_garbage = torch.where(hidden, float("nan"), x), torch.where(hidden, float("inf"), mask)
    y_from_garbage = sms.scaled_mask_softmax(x_garbage, mask_garbage, 0.5, True, causal_variant)
    assert torch.equal(y_from_garbage, y)

    dy = random_scores(x.shape, dtype, device, generator_seed=2)
    dx = torch.ops.scaled_mask_softmax.backward(y, dy, 0.5, True, causal_variant)
    y_garbage, dy_garbage = torch.where(hidden, float("nan"), y), torch.where(hidden, float("nan"), dy)
    dx_from_garbage = torch.ops.scaled_mask_softmax.backward(y_garbage, dy_garbage, 0.5, True, causal_variant)
    assert torch.equal(dx_from_garbage, dx)
    assert not dx[:, hidden].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [128, 512, 1024])
@pytest.mark.parametrize("variant", ["none", "mask", "causal", "causal_mask"])
def test_article_matrix(device, dtype, size, variant):
    """The article's matrix: no mask, additive 0/-inf mask, causal, causal plus mask; S = 128, 512, 1024."""
    batch, heads = (2, 2) if device == "cpu" else (4, 8)
    x = random_scores((batch, heads, size, size), dtype, device)
    mask = None
    if "mask" in variant:
        generator = torch.Generator().manual_seed(3)
        masked = torch.rand((batch, 1, size, size), generator=generator) < 0.25
        mask = torch.zeros(masked.shape, dtype=dtype).masked_fill(masked, float("-inf")).to(device)
    run(x, mask, scale=size ** -0.5, is_causal="causal" in variant)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [5, 64, 3000, 12000, 20000])
def test_fully_masked_rows_give_zeros_and_zero_gradient(device, dtype, cols):
    x = random_scores((4, cols), dtype, device)
    bool_mask = torch.ones(4, cols, dtype=torch.bool)
    bool_mask[1] = False
    additive = torch.zeros(4, cols, dtype=dtype)
    additive[2] = float("-inf")
    for mask in (bool_mask.to(device), additive.to(device)):
        y = run(x, mask)
        masked_row = 1 if mask.dtype == torch.bool else 2
        assert torch.equal(y[masked_row].float().cpu(), torch.zeros(cols))
        assert not torch.isnan(y).any()
    # lower_right with more queries than keys: the first Sq - Sk queries see nothing.
    y = run(random_scores((2, 7, 3), dtype, device), is_causal=True, causal_variant="lower_right")
    assert torch.equal(y[:, :4].float().cpu(), torch.zeros(2, 4, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_scores_at_the_edges_of_fp32(device):
    """As the README says: a probability below fp32's normal range is 0; a score that overflows fp32 downwards counts
    as masked, one that overflows upwards makes its row NaN; NaN under a False bool mask still makes its row NaN; an
    fp32 bias under bf16 scores is not rounded to bf16."""
    x = torch.tensor([[0.0, -90.0, 0.0], [-1e30, -2e30, -3e30], [1e30, 0.0, 0.0]], device=device)
    y = sms.scaled_mask_softmax(x[:1])
    assert y[0, 1] == 0 and torch.allclose(y[0, [0, 2]].cpu(), torch.tensor([0.5, 0.5]))
    y = sms.scaled_mask_softmax(x[1:], scale=1e10)
    assert not y[0].any() and y[1].isnan().all()
    x = torch.tensor([[float("nan"), 1.0, 2.0], [0.0, 1.0, 2.0]], device=device)
    y = sms.scaled_mask_softmax(x, torch.tensor([False, True, True], device=device))
    assert y[0].isnan().all() and not y[1].isnan().any()
    x = torch.zeros(1, 2, dtype=torch.bfloat16, device=device)
    bias = torch.tensor([256.0, 256.5], device=device)  # 256.5 is no bf16 number
    expected = torch.softmax(torch.tensor([0.0, 0.5], dtype=torch.float64), dim=-1)
    assert_close_to(sms.scaled_mask_softmax(x, bias)[0], expected, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_finite_large_negative_mask_behaves_as_torch_softmax(device, dtype):
    x = random_scores((3, 40), dtype, device)
    mask = torch.zeros(3, 40, dtype=dtype)
    mask[0] = torch.finfo(dtype).min
    mask[1, :20] = torch.finfo(dtype).min
    mask = mask.to(device)
    expected = torch.softmax(x.float() + mask.float(), dim=-1)
    assert_close_to(sms.scaled_mask_softmax(x, mask), expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cols", [8192, 20000, 65536])
def test_long_rows_shifted_far_from_zero(device, dtype, cols):
    """Long rows (blocks and clusters, some reducing their max and sum at once, each thread's terms shifted by its
    own max) whose scores all sit near a large offset: 50,000 (a row's max within the fused exponential's limit,
    65,536), 65,530 (its scores on either side of it), 10^6 (all beyond it). x is in multiples of 1/16, so
    that x + offset is exact in fp32 and the float64 reference sees the same scores; softmax(x) is the answer for
    every offset. Then rows masked by finfo.min but for a few keys, and all but none, against torch.softmax."""
    x = ((torch.randn(4, cols, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 32).round() / 16)
    offsets = torch.tensor([0.0, 50000.0, 65530.0, 1e6], dtype=torch.float64)
    mask = offsets[:, None].expand(4, cols).float().contiguous()
    run(x.to(dtype).to(device), mask.to(device))
    x = random_scores((3, cols), dtype, device)
    mask = torch.full((3, cols), torch.finfo(dtype).min, dtype=dtype)
    mask[0, ::997] = 0
    mask[1, -3:] = 0
    mask[2] = torch.finfo(dtype).min
    mask = mask.to(device)
    expected = torch.softmax(x.float() + mask.float(), dim=-1)
    assert_close_to(sms.scaled_mask_softmax(x, mask), expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-4, 30.0, -2.0, 0.0])
def test_stable_for_large_scores_and_any_scale(device, dtype, scale):
    x = random_scores((4, 300), dtype, device) * 100
    run(x, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["transposed_heads", "sliced_keys", "strided_keys", "offset_view",
                                    "expanded_batch", "rank6"])
def test_non_contiguous_and_misaligned_input(device, dtype, layout):
    base = random_scores((2, 6, 8, 130), dtype, device)
    x = {
        "transposed_heads": lambda: base.transpose(1, 2),                # outer dims permuted
        "sliced_keys": lambda: base[..., :128],                          # rows strided, aligned
        "strided_keys": lambda: base[..., ::2],                          # last dim strided
        "offset_view": lambda: base[..., 1:129],                         # rows start misaligned
        "expanded_batch": lambda: base[:1].expand(3, 6, 8, 130),         # stride-0 batch
        "rank6": lambda: base.reshape(2, 3, 2, 2, 4, 130).transpose(1, 3),
    }[layout]()
    assert not x.is_contiguous()
    before = x.clone()
    mask = torch.zeros(x.shape[-1], dtype=dtype, device=device)
    mask[-3:] = float("-inf")
    run(x, mask, scale=0.9, is_causal=True)
    assert torch.equal(x, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_shape", [(9,), (3, 1, 1, 9), (1, 2, 5, 9), (3, 2, 5, 9)])
def test_mask_gradients(device, mask_shape):
    x = random_scores((3, 2, 5, 9), torch.float32, device)
    bias = random_scores(mask_shape, torch.float32, device, generator_seed=4)
    run(x, bias, scale=0.8, is_causal=True, check_mask_grad=True)


@pytest.mark.parametrize("device", DEVICES)
def test_mask_gradient_without_x_gradient(device):
    x = random_scores((2, 4, 6), torch.float32, device)
    bias = random_scores((4, 6), torch.float32, device, generator_seed=5).requires_grad_()
    weights = random_scores(x.shape, torch.float32, device, generator_seed=6)
    (sms.scaled_mask_softmax(x, bias, 2.0) * weights).sum().backward()
    bias64 = bias.detach().double().requires_grad_()
    (sms.scaled_mask_softmax_reference(x.double(), bias64, 2.0) * weights.double()).sum().backward()
    assert_close_to(bias.grad, bias64.grad, torch.float32, scale=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bias_gradient_under_16_bit_scores_is_summed_in_fp32(device, dtype):
    """A learnable fp32 bias under 16-bit x: its gradient within fp32's rounding of the float64 sum of the score
    gradients formed from our own y and dy (each term formed in 16 bits would round, the smallest to zero, before
    the sum), and x's gradient the same, bit for bit, as with a bias that is not learnable."""
    x = random_scores((4, 6, 64, 64), dtype, device)
    bias = random_scores((64, 64), torch.float32, device, generator_seed=4)
    dy = random_scores(x.shape, dtype, device, generator_seed=1) * 1e-5
    x_learning, bias_learning = x.clone().requires_grad_(), bias.clone().requires_grad_()
    y = sms.scaled_mask_softmax(x_learning, bias_learning, 0.125)
    y.backward(dy)
    y64, dy64 = y.detach().double().cpu(), dy.double().cpu()
    terms = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
    expected = terms.sum((0, 1))
    error = (bias_learning.grad.double().cpu() - expected).abs()
    assert (error <= 1e-5 * terms.abs().sum((0, 1)) + 1e-30).all()
    x_alone = x.clone().requires_grad_()
    sms.scaled_mask_softmax(x_alone, bias, 0.125).backward(dy)
    # Its row sums may be added in another order, by another kernel.
    torch.testing.assert_close(x_learning.grad, x_alone.grad, rtol=2 * UNIT_ROUNDOFF[dtype],
                               atol=UNIT_ROUNDOFF[dtype] * x_alone.grad.abs().max().item())


# Biases that repeat along leading dims, whose gradient one pass over y and dy sums with dx (on CUDA, in as many parts
# as fill the device; beyond a block's registers, 9001 and 12,000 columns, in a cluster's on sm_90, in vectors where
# rows are whole 16-byte vectors, element by element otherwise; by ATen in fp64), and one that repeats along a middle
# dim, which autograd sums; rows of groups of lanes, of blocks, and rows that start mid-vector (9, 49, 1001 and 1500
# columns): in vectors where groups of lanes or a warp hold them (16-bit rows of 1500 columns: one warp at six vectors
# a thread), their sums moved to the row's own columns, whichever place in its vector each of a bias row's rows starts
# at (the keys' bias: every place); element by element otherwise (fp32 rows of 1001 and 1500 columns).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [9, 49, 64, 1001, 1500, 4096, 9001, 12000])
@pytest.mark.parametrize("bias_shape", [(1,), (5, 1), (1, 4, 5, 1), (3, 4, 5, 1), (4, 1, 1)],
                         ids=["keys", "queries", "heads", "full", "heads_keys"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["not_causal", "lower_right"])
def test_learnable_bias_gradients(device, dtype, cols, bias_shape, is_causal):
    x = random_scores((3, 4, 5, cols), dtype, device)
    bias = random_scores(bias_shape[:-1] + (cols,), torch.float32, device, generator_seed=4)
    run(x, bias, scale=0.6, is_causal=is_causal, causal_variant="lower_right", check_mask_grad=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_shape, create_graph, ops", [
    ((1, 3, 4, 16), False, ["backward_with_bias_grad"]),
    ((4, 16), False, ["backward_with_bias_grad"]),
    ((3, 1, 16), False, ["backward", "backward"]),
    ((1, 3, 4, 16), True, ["backward", "backward"]),
], ids=["heads", "queries", "heads_keys", "create_graph"])
def test_learnable_bias_backward_ops(device, bias_shape, create_graph, ops):
    """A bias that repeats along leading dims has dx and its gradient from one op; one that repeats otherwise, or
    whose backward is to be differentiated again, takes the backward op twice (the score gradients, then dx)."""
    x = random_scores((2, 3, 4, 16), torch.float32, device).requires_grad_()
    bias = random_scores(bias_shape, torch.float32, device, generator_seed=4).requires_grad_()
    y = sms.scaled_mask_softmax(x, bias, 0.5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        torch.autograd.grad(y, (x, bias), torch.ones_like(y), create_graph=create_graph)
    prefix = "scaled_mask_softmax::"
    assert [event.name[len(prefix):] for event in profile.events() if event.name.startswith(prefix)] == ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_with_bias_grad_op(device, dtype):
    """The op autograd takes for a bias that repeats along leading dims: dx as the backward op gives it, and each bias
    row's score gradients y * (dy - sum(dy * y)) summed in the compute type; a bias_rows that is no divisor of the
    rows is refused. dy is a view whose rows are spaced apart, read through its strides."""
    y = sms.scaled_mask_softmax(random_scores((6, 4, 40), dtype, device), None, 1.0, True, "lower_right")
    dy = random_scores((4, 6, 40), dtype, device, generator_seed=1).transpose(0, 1)
    dx, bias_grad = torch.ops.scaled_mask_softmax.backward_with_bias_grad(y, dy, 0.5, True, "lower_right", 8)
    compute_type = torch.float64 if dtype == torch.float64 else torch.float32
    assert bias_grad.shape == (8, 40) and bias_grad.dtype == compute_type
    torch.testing.assert_close(dx, torch.ops.scaled_mask_softmax.backward(y, dy, 0.5, True, "lower_right"),
                               rtol=2 * UNIT_ROUNDOFF.get(dtype, 1e-6), atol=1e-6)
    y64, dy64 = y.double(), dy.double()
    terms = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
    expected = terms.reshape(3, 8, 40).sum(0)
    assert ((bias_grad.double() - expected).abs() <= 1e-5 * terms.abs().reshape(3, 8, 40).sum(0) + 1e-30).all()
    torch.library.opcheck(torch.ops.scaled_mask_softmax.backward_with_bias_grad.default,
                          (y, dy, 0.5, True, "lower_right", 8), test_utils=("test_schema", "test_faketensor"))
    for bias_rows in (0, 5):
        with pytest.raises(ValueError, match="bias_rows must be a positive divisor of y's 24 rows"):
            torch.ops.scaled_mask_softmax.backward_with_bias_grad(y, dy, 0.5, True, "lower_right", bias_rows)


@pytest.mark.parametrize("device", DEVICES)
def test_under_autocast_probabilities_keep_the_scores_dtype(device):
    """The operator has no autocast rule: under torch.autocast it takes the 16-bit scores a matmul gives and returns
    probabilities in their dtype (torch.softmax's rule would widen them to fp32), computed in fp32, and the gradient
    reaches fp32 q and k."""
    q, k = (random_scores((2, 3, 16, 32), torch.float32, device, generator_seed=seed).requires_grad_()
            for seed in (1, 2))
    padding = torch.ones(2, 1, 1, 16, dtype=torch.bool, device=device)
    padding[1, ..., 12:] = False
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        scores = q @ k.transpose(-1, -2)
        scores.retain_grad()
        y = sms.scaled_mask_softmax(scores, padding, 0.125, is_causal=True)
    assert scores.dtype == y.dtype == torch.bfloat16
    dy = random_scores(y.shape, torch.bfloat16, device, generator_seed=3)
    y.backward(dy)
    assert q.grad.dtype == k.grad.dtype == torch.float32
    y_ref, dx_ref, _ = reference_forward_backward(scores, padding, 0.125, True, "upper_left", dy)
    assert_16_bit_softmax_close(y, scores.grad, y_ref, dx_ref, dy, torch.bfloat16, 0.125)


@pytest.mark.parametrize("device", DEVICES)
def test_bool_mask_gets_no_gradient(device):
    x = random_scores((2, 4, 6), torch.float32, device).requires_grad_()
    mask = torch.ones(4, 6, dtype=torch.bool, device=device)
    sms.scaled_mask_softmax(x, mask).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal_variant", ["upper_left", "lower_right"])
def test_gradcheck_float64(device, causal_variant):
    x = random_scores((2, 3, 4, 6), torch.float64, device).requires_grad_()
    bias = random_scores((1, 3, 4, 6), torch.float64, device, generator_seed=6).requires_grad_()

    def op(x, bias):
        return sms.scaled_mask_softmax(x, bias, 0.6, True, causal_variant)

    assert torch.autograd.gradcheck(op, (x, bias), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(op, (x, bias), check_fwd_over_rev=True)


@pytest.mark.parametrize("device", DEVICES)
@CAUSAL_LIMITS
def test_backward_op_derivatives(device, is_causal, variant):
    # In y and dy, as backward(create_graph=True) sees them, and their own derivatives.
    x = random_scores((2, 4, 6), torch.float64, device)
    y = sms.scaled_mask_softmax(x, None, 0.6, is_causal, variant).requires_grad_()
    dy = random_scores(x.shape, torch.float64, device, generator_seed=6).requires_grad_()

    def backward(y, dy):
        return torch.ops.scaled_mask_softmax.backward(y, dy, 0.6, is_causal, variant)

    assert torch.autograd.gradcheck(backward, (y, dy))
    assert torch.autograd.gradgradcheck(backward, (y, dy))


@pytest.mark.parametrize("device", DEVICES)
@CAUSAL_LIMITS
def test_second_derivatives_match_the_reference(device, is_causal, variant):
    # A gradient penalty: the norm of d(loss)/dx, differentiated again, through x and a learnable bias; one row of
    # the mask hides every key.
    x = random_scores((2, 3, 4, 6), torch.float64, device)
    bias = random_scores((4, 6), torch.float64, device, generator_seed=5)
    bias[1] = float("-inf")
    weights = random_scores(x.shape, torch.float64, device, generator_seed=6)

    def penalty_gradients(op):
        leaves = x.clone().requires_grad_(), bias.clone().requires_grad_()
        loss = (op(*leaves, 0.7, is_causal, variant) * weights).square().sum()
        grad_x, _ = torch.autograd.grad(loss, leaves, create_graph=True)
        grad_x.square().sum().backward()
        return [leaf.grad for leaf in leaves]

    for ours, expected in zip(penalty_gradients(sms.scaled_mask_softmax),
                              penalty_gradients(sms.scaled_mask_softmax_reference)):
        assert_close_to(ours, expected, torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@CAUSAL_LIMITS
def test_torch_func_transforms_match_the_reference(device, is_causal, variant):
    x = random_scores((2, 3, 5), torch.float64, device)
    bias = random_scores((3, 5), torch.float64, device, generator_seed=5)
    weights = random_scores(x.shape, torch.float64, device, generator_seed=6)
    batch = random_scores((4, *x.shape), torch.float64, device, generator_seed=7)

    def transformed(op):
        def loss(a, b):
            return (op(a, b, 0.7, is_causal, variant) * weights).square().sum()

        per_sample_bias_grad = torch.func.vmap(torch.func.grad(loss, argnums=1), in_dims=(0, None))
        return [*torch.func.grad(loss, argnums=(0, 1))(x, bias),
                torch.func.vjp(lambda a: op(a, bias, 0.7, is_causal, variant), x)[1](weights)[0],
                torch.func.jacrev(lambda a: op(a, None, 0.7, is_causal, variant))(x[0]),
                torch.func.hessian(loss, argnums=1)(x, bias),
                per_sample_bias_grad(batch, bias),
                torch.func.vmap(lambda b: op(x, b, 0.7, is_causal, variant))(batch[:, 0])]

    for ours, expected in zip(transformed(sms.scaled_mask_softmax), transformed(sms.scaled_mask_softmax_reference)):
        assert_close_to(ours, expected, torch.float64)


@pytest.mark.parametrize("device", DEVICES)
def test_functionalize_alone_and_with_vmap(device):
    x = random_scores((4, 3, 5), torch.float64, device)
    bias = random_scores((3, 5), torch.float64, device, generator_seed=5)
    transforms = [torch.func.functionalize,
                  lambda f: torch.func.functionalize(torch.func.vmap(f)),
                  lambda f: torch.func.vmap(torch.func.functionalize(f))]
    for transform in transforms:
        ours, expected = (transform(lambda a, op=op: op(a, bias, 0.7, True, "lower_right"))(x)
                          for op in (sms.scaled_mask_softmax, sms.scaled_mask_softmax_reference))
        assert_close_to(ours, expected, torch.float64)


@pytest.mark.skipif(not _transforms.BATCHING_RULES,
                    reason=f"the batching rules are registered from torch 2.6, not on {torch.__version__}")
@pytest.mark.parametrize("device", DEVICES)
def test_vmap_takes_the_operators_batching_rules(device):
    """Each op runs twice under vmap, as the profiler counts it: the call vmap sees, and the one batched call its
    rule makes. Without a batching rule vmap would run the op once per sample (4 more)."""
    scores = random_scores((4, 2, 3, 5), torch.float32, device)
    dy = random_scores(scores.shape[1:], torch.float32, device, generator_seed=5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        ys = torch.func.vmap(lambda s: torch.ops.scaled_mask_softmax.forward(s, None, 0.5, True, "lower_right"))(scores)
        dxs = torch.func.vmap(lambda y: torch.ops.scaled_mask_softmax.backward(y, dy, 0.5, True, "lower_right"))(ys)
    for op in ("forward", "backward"):
        assert sum(event.name == f"scaled_mask_softmax::{op}" for event in profile.events()) == 2, op
    assert torch.equal(ys, sms.scaled_mask_softmax(scores, None, 0.5, True, "lower_right"))
    assert torch.equal(dxs, torch.ops.scaled_mask_softmax.backward(ys, dy.expand_as(ys), 0.5, True, "lower_right"))


@pytest.mark.parametrize("device", DEVICES)
@CAUSAL_LIMITS
def test_forward_mode_matches_the_reference(device, is_causal, variant):
    # torch.func.jvp, jacfwd and torch.autograd.forward_ad: the tangent through x and through a floating mask.
    x = random_scores((2, 3, 4, 6), torch.float64, device)
    bias = random_scores((4, 6), torch.float64, device, generator_seed=5)
    tangents = (random_scores(x.shape, torch.float64, device, generator_seed=6),
                random_scores(bias.shape, torch.float64, device, generator_seed=7))
    ours = torch.func.jvp(lambda a, b: sms.scaled_mask_softmax(a, b, 0.7, is_causal, variant), (x, bias), tangents)
    expected = torch.func.jvp(lambda a, b: sms.scaled_mask_softmax_reference(a, b, 0.7, is_causal, variant),
                              (x, bias), tangents)
    assert_close_to(ours[0], expected[0], torch.float64)
    assert_close_to(ours[1], expected[1], torch.float64)
    row = x[0, 0, 0]
    jacobian = torch.func.jacfwd(lambda a: sms.scaled_mask_softmax(a, None, 0.7))(row)
    assert_close_to(jacobian, torch.func.jacfwd(lambda a: sms.scaled_mask_softmax_reference(a, None, 0.7))(row),
                    torch.float64)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_and_reverse_mode_together(device):
    import torch.autograd.forward_ad as forward_ad

    x = random_scores((3, 7), torch.float64, device)
    tangent = random_scores(x.shape, torch.float64, device, generator_seed=6)
    weights = random_scores(x.shape, torch.float64, device, generator_seed=7)
    _, expected_tangent = torch.func.jvp(lambda a: sms.scaled_mask_softmax_reference(a, None, 0.7), (x,), (tangent,))
    with forward_ad.dual_level():
        leaf = x.clone().requires_grad_()
        y = sms.scaled_mask_softmax(forward_ad.make_dual(leaf, tangent), None, 0.7)
        assert_close_to(forward_ad.unpack_dual(y).tangent, expected_tangent, torch.float64)
        (y * weights).sum().backward()
    reference_leaf = x.clone().requires_grad_()
    (sms.scaled_mask_softmax_reference(reference_leaf, None, 0.7) * weights).sum().backward()
    assert_close_to(leaf.grad, reference_leaf.grad, torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4), (0,)])
def test_empty_tensors(device, shape):
    x = torch.empty(shape, device=device, requires_grad=True)
    y = sms.scaled_mask_softmax(x, is_causal=len(shape) >= 2)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
def test_module_matches_function(device):
    layer = sms.ScaledMaskSoftmax(scale=0.25, is_causal=True, causal_variant="lower_right")
    x = random_scores((2, 3, 5), torch.float32, device)
    mask = torch.ones(5, dtype=torch.bool, device=device)
    assert torch.equal(layer(x, mask), sms.scaled_mask_softmax(x, mask, 0.25, True, "lower_right"))
    assert "lower_right" in repr(layer)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_opcheck(device, with_mask):
    x = random_scores((2, 3, 4, 40), torch.float32, device).requires_grad_()
    mask = torch.zeros(2, 1, 1, 40, device=device) if with_mask else None
    torch.library.opcheck(torch.ops.scaled_mask_softmax.forward.default, (x, mask, 0.5, True, "upper_left"))
    y = torch.ops.scaled_mask_softmax.forward(x.detach(), mask, 0.5, True, "lower_right").requires_grad_()
    torch.library.opcheck(torch.ops.scaled_mask_softmax.backward.default,
                          (y, torch.randn_like(y, requires_grad=True), 0.5, True, "lower_right"))


class CausalScores(torch.nn.Module):
    def forward(self, x, mask):
        return sms.scaled_mask_softmax(x, mask, 0.5, is_causal=True)


def exported(module, device):
    """`module` under torch.export, its batch dim left dynamic."""
    x = random_scores((2, 3, 5, 8), torch.float32, device)
    mask = random_scores((8,), torch.float32, device, generator_seed=3)
    return torch.export.export(module, (x, mask), dynamic_shapes={"x": {0: torch.export.Dim("batch")}, "mask": None})


@pytest.mark.parametrize("device", DEVICES)
def test_torch_export_keeps_the_operator(device):
    # Serving: the exported program holds the operator as one node (shapes from its fake kernel) and runs it at
    # another batch size.
    program = exported(CausalScores(), device)
    calls = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert calls == [torch.ops.scaled_mask_softmax.forward.default]
    x = random_scores((4, 3, 5, 8), torch.float32, device, generator_seed=4)
    mask = random_scores((8,), torch.float32, device, generator_seed=5)
    assert torch.equal(program.module()(x, mask), CausalScores()(x, mask))


class PlainScores(torch.nn.Module):
    def forward(self, x, mask):
        return torch.softmax(x * 0.5 + mask, dim=-1)


LOAD_AND_CALL = """
import sys
import torch
import scaled_mask_softmax  # registers the operator that the package calls
package, inputs, output = sys.argv[1:]
torch.save(torch._inductor.aoti_load_package(package)(*torch.load(inputs)), output)
"""


def aot_inductor_package_called(module, args, folder):
    """`module` exported and compiled by AOTInductor for the CPU, then loaded and called on `args` in a process of
    its own (a crash there fails only this call): the subprocess's outcome, and the output it saved."""
    folder.mkdir()
    package = torch._inductor.aoti_compile_and_package(exported(module, "cpu"),
                                                       package_path=str(folder / "package.pt2"))
    torch.save(args, folder / "args.pt")
    finished = subprocess.run([sys.executable, "-c", LOAD_AND_CALL, package, str(folder / "args.pt"),
                               str(folder / "output.pt")], capture_output=True, text=True, timeout=300,
                              env=environment_importing_this_package())
    return finished, (torch.load(folder / "output.pt") if finished.returncode == 0 else None)


@pytest.mark.skipif(not hasattr(torch._inductor, "aoti_compile_and_package"),
                    reason=f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package (new in 2.6)")
def test_aot_inductor_package_calls_the_operator(tmp_path):
    # Serving without Python's torch.export: the package calls the operator through the dispatcher. On the CPU only:
    # the same call on CUDA would also compile the package's own kernels.
    x = random_scores((4, 3, 5, 8), torch.float32, "cpu", generator_seed=4)
    mask = random_scores((8,), torch.float32, "cpu", generator_seed=5)
    finished, output = aot_inductor_package_called(CausalScores(), (x, mask), tmp_path / "ours")
    if finished.returncode != 0:
        # On one machine torch 2.11's AOTInductor crashed loading even a package of torch.softmax alone.
        plain, _ = aot_inductor_package_called(PlainScores(), (x, mask), tmp_path / "plain")
        if plain.returncode != 0:
            pytest.skip(f"torch {torch.__version__}'s AOTInductor fails here on a package of torch.softmax alone "
                        f"(exit {plain.returncode})")
    assert finished.returncode == 0, f"exit {finished.returncode}: {finished.stdout[-3000:]}{finished.stderr[-3000:]}"
    assert torch.equal(output, CausalScores()(x, mask))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_forward_and_backward(device):
    torch._dynamo.reset()

    def weighted(softmax, x, mask, weights):
        return (softmax(x, mask, 0.5, is_causal=True) * weights).sum()

    x = random_scores((2, 2, 8, 8), torch.float32, device).requires_grad_()
    bias = random_scores((2, 8, 8), torch.float32, device, generator_seed=4).requires_grad_()
    weights = random_scores(x.shape, torch.float32, device, generator_seed=5)
    loss = torch.compile(weighted, fullgraph=True)(sms.scaled_mask_softmax, x, bias, weights)
    loss.backward()
    x64, bias64 = (t.detach().double().requires_grad_() for t in (x, bias))
    expected = weighted(sms.scaled_mask_softmax_reference, x64, bias64, weights.double())
    expected.backward()
    assert_close_to(loss, expected, torch.float32, scale=10)
    assert_close_to(x.grad, x64.grad, torch.float32, scale=4)
    assert_close_to(bias.grad, bias64.grad, torch.float32, scale=8)
