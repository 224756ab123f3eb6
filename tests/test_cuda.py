"""What only a GPU shows: streams, devices, CUDA graphs, very long rows, determinism."""
import subprocess
import sys

import pytest
import torch

import scaled_mask_softmax as sms
from conftest import (UNIT_ROUNDOFF, assert_16_bit_softmax_close, assert_close_to, environment_importing_this_package,
                      random_scores, reference_forward_backward)
from scaled_mask_softmax.reference import scaled_mask_softmax_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def assert_outputs_match(y, dx, y_ref, dx_ref, dy, dtype, scale):
    """y and dx against the float64 reference: 16-bit ones element by element in units of their roundings too."""
    if dtype in UNIT_ROUNDOFF:
        assert_16_bit_softmax_close(y, dx, y_ref, dx_ref, dy, dtype, scale)
    assert_close_to(y, y_ref, dtype)
    assert_close_to(dx, dx_ref, dtype, scale=4)


def assert_forward_backward_match(x, mask, scale, is_causal=False, causal_variant="upper_left"):
    """x's forward and backward (from a random dy) against the float64 reference; returns y. The memory that y and
    dx take is left holding NaN first, so that an element a kernel does not write shows."""
    torch.full_like(x, float("nan"))  # freed at once: the allocator hands its memory to y next
    y = sms.scaled_mask_softmax(x, mask, scale, is_causal, causal_variant)
    dy = random_scores(x.shape, x.dtype, x.device, generator_seed=1)
    torch.full_like(x, float("nan"))  # and to dx
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, mask, scale, is_causal, causal_variant, dy)
    assert_outputs_match(y, x.grad, y_ref, dx_ref, dy, x.dtype, scale)
    return y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
# A row split over a cluster's blocks, staged through their shared memory on sm_90 (as test_long_rows_staged_in_clusters
# below; bf16 at 100000 and 131080 over 7 and 5 blocks and fp32 at 100000 over 7, the counts that fill the most of their
# threads' vector slots), held in their registers where the device holds no such staged cluster: bf16 at 65536 and
# 100000 in 4 and 8 blocks, at 131080 and 262144 at eight vectors a thread in the count most_resident_wide takes
# (where 16 would take four; 131080: the last slice partly filled); fp32 at 65536 in 8 blocks, at 100000 at eight
# vectors a thread. The backward's rows at eight vectors a thread likewise.
# Otherwise two passes over slices (element-wise loads, and rows beyond the registers of 16 blocks).
@pytest.mark.parametrize("cols", [65536, 100000, 131080, 262144, 262147, 524288])
def test_very_long_rows(dtype, cols):
    x = random_scores((2, cols), dtype, "cuda").requires_grad_()
    mask = torch.zeros(cols, dtype=dtype, device="cuda")
    mask[::7] = float("-inf")
    assert_forward_backward_match(x, mask, 0.3)


def mask_of_form(mask_form, x, key_shape=None, bias_shape=None):
    """None ("none"); a bool key mask of `key_shape`, about 30% masked ("key_padding"); scores of x's shape ("full")
    or of `bias_shape` ("bias") in x's dtype; scores of `bias_shape` in fp32 ("fp32_bias")."""
    if mask_form == "none":
        return None
    if mask_form == "key_padding":
        return (torch.rand(key_shape, generator=torch.Generator().manual_seed(3)) > 0.3).to(x.device)
    shape = x.shape if mask_form == "full" else bias_shape
    return random_scores(shape, torch.float32 if mask_form == "fp32_bias" else x.dtype, x.device, generator_seed=2)


# Rows that start mid-vector (odd column counts), too long for a block's registers: split over a cluster's blocks in
# vectors from the boundary before each row, the first slice masking the previous row's end and the last the next
# row's start. The backward: fp32 at 9001 and 40,001 columns in 2 and 8 blocks, 16-bit at 20,001 and 65,539 in 2 and
# 8; fp32 at 65,539 and 16-bit at 131,077 (bf16 and fp16) and 200,003 at eight vectors a thread in the count (5-16)
# most_resident_wide takes; the forward likewise but fp32 at 9001, which a block holds (its bf16 rows with a full
# mask or a bias in forward_in_cluster_wide's 96 registers a thread). Masks whose rows start elsewhere in their
# vectors than x's (a key mask), as far in (a full mask), or as far in or half a vector further (a bias over 4 rows of
# the 16-bit lengths: 4 x cols is half a vector past a whole number of them).
@pytest.mark.parametrize("dtype, cols", [(torch.float32, 9001), (torch.float32, 40001), (torch.bfloat16, 20001),
                                         (torch.float16, 65539), (torch.float32, 65539), (torch.bfloat16, 131077),
                                         (torch.float16, 131077), (torch.bfloat16, 200003)])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "full", "bias"])
def test_long_rows_that_start_mid_vector(dtype, cols, mask_form):
    x = random_scores((2, 4, cols), dtype, "cuda").requires_grad_()
    mask = mask_of_form(mask_form, x, key_shape=(cols,), bias_shape=(4, cols))
    assert_forward_backward_match(x, mask, 0.3)


# The same rows of 131,077 columns with a key mask, enough of them (32) that the mask is written out over 8 rows
# (repeat_mask_alike), each starting as far into its vectors as x's: forward_in_cluster_wide's bool kernel.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_rows_that_start_mid_vector_with_a_key_mask_written_out(dtype):
    x = random_scores((32, 131077), dtype, "cuda").requires_grad_()
    assert_forward_backward_match(x, mask_of_form("key_padding", x, key_shape=(131077,)), 0.3)


# Rows that start mid-vector without a mask, split over a cluster's blocks and staged through shared memory (bulk copies
# from the vector boundary before each row), with many rows a cluster so that every stage is taken again; the last row's
# vectors come from the copy of x's last bytes. fp16 at 65,539 and bf16 at 131,077 over 3 and 5 blocks, the counts that
# fill the most of their threads' vector slots. A row that saw a NaN is NaN to its end, the next row not.
@pytest.mark.parametrize("dtype, rows, cols", [(torch.bfloat16, 600, 20001), (torch.float32, 300, 40001),
                                               (torch.float16, 150, 65539), (torch.bfloat16, 40, 131077)])
def test_long_rows_that_start_mid_vector_staged(dtype, rows, cols):
    x = random_scores((rows, cols), dtype, "cuda")
    x[7, cols // 2] = float("nan")
    y = sms.scaled_mask_softmax(x, None, 0.3)
    assert y[7].isnan().all() and not y[[6, 8]].isnan().any()
    assert_close_to(y, scaled_mask_softmax_reference(x.double(), None, 0.3), dtype)


# Causal rows that start mid-vector, too long for one pass (fp32 from 8192 columns, 16-bit from 16,384): two passes in
# vectors from the boundary before each row, as above, zeros past the keys a row sees. Lower-right, so that every row
# sees nearly all its keys and none is narrowed. A bias over 3 heads of 6 queries starts half a vector from x's every
# other batch in fp32 (18 x 9001 elements), elsewhere in 16-bit; one in fp32 for 16-bit x, x's compute type.
@pytest.mark.parametrize("dtype, cols", [(torch.float32, 9001), (torch.bfloat16, 16385), (torch.float16, 20001)])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "full", "bias", "fp32_bias"])
def test_long_causal_rows_that_start_mid_vector(dtype, cols, mask_form):
    x = random_scores((2, 3, 6, cols), dtype, "cuda").requires_grad_()
    mask = mask_of_form(mask_form, x, key_shape=(2, 1, 1, cols), bias_shape=(3, 6, cols))
    assert_forward_backward_match(x, mask, 0.3, is_causal=True, causal_variant="lower_right")


# Causal rows that start mid-vector, without a mask, that blocks hold in registers: on sm_90 brought into shared memory
# by bulk copies from the vector boundary before each row, each row's visible vectors only (forward_staged's kShifted;
# causal rows of 8 KiB or more): bf16 rows of 4099 and 9001 columns, fp32 of 2051 and 9001 (which would take two
# passes). Upper-left the rows see from one key on, lower-right nearly all; the last row's vectors come from the copy
# of x's last bytes. A row that saw a NaN is NaN to its end, and the next row is not.
@pytest.mark.parametrize("dtype, queries, cols, causal_variant", [(torch.bfloat16, 600, 4099, "upper_left"),
                                                                  (torch.bfloat16, 600, 4099, "lower_right"),
                                                                  (torch.bfloat16, 40, 9001, "lower_right"),
                                                                  (torch.float32, 300, 2051, "upper_left"),
                                                                  (torch.float32, 40, 9001, "lower_right")])
def test_causal_rows_that_start_mid_vector_staged(dtype, queries, cols, causal_variant):
    x = random_scores((2, 3, queries, cols), dtype, "cuda").requires_grad_()
    assert_forward_backward_match(x, None, 0.5, True, causal_variant)
    x = x.detach().clone()
    x[1, 2, 5, 0] = float("nan")
    y = sms.scaled_mask_softmax(x, None, 0.5, True, causal_variant)
    assert y[1, 2, 5].isnan().all() and not y[1, 2, [4, 6]].isnan().any()
    assert_close_to(y, scaled_mask_softmax_reference(x.double(), None, 0.5, True, causal_variant), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal_variant", ["upper_left", "lower_right"])
def test_long_rows_that_see_few_keys(dtype, causal_variant):
    """Causal rows of 262,144 columns that see at most a quarter of their keys (upper-left): the kernels take only
    their first 64 columns and the rest of y and dx is zeroed apart. Lower-right, the two-pass kernels take it all."""
    x = random_scores((2, 3, 262144), dtype, "cuda").requires_grad_()
    y = sms.scaled_mask_softmax(x, None, 0.5, True, causal_variant)
    dy = random_scores(x.shape, dtype, "cuda", generator_seed=1)
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, None, 0.5, True, causal_variant, dy)
    assert_outputs_match(y, x.grad, y_ref, dx_ref, dy, dtype, 0.5)
    if causal_variant == "upper_left":
        assert not y[..., 3:].any() and not x.grad[..., 3:].any()


@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 16384), (torch.bfloat16, 65536), (torch.bfloat16, 65537),
                                         (torch.float32, 8192), (torch.float32, 65536)])
@pytest.mark.parametrize("causal_variant", ["upper_left", "lower_right"])
def test_causal_rows_in_two_passes_are_zero_past_what_they_see(dtype, cols, causal_variant):
    """Causal rows that the two-pass kernels would take, more than the device holds at once. Lower-right they see
    nearly all their keys, and the two-pass kernels take them (forward_staged, on sm_90, the forwards of 16,384 bf16
    and 8192 fp32 columns); upper-left at most 300, and the kernels take their first 320 columns while the rest of y
    and dx is zeroed apart (in 2-byte words where rows are not 16-byte aligned: 65537). The memory that y and dx then
    take is left holding NaN first, so that a zero not written shows."""
    x = random_scores((2, 2, 300, cols), dtype, "cuda").requires_grad_()
    dy = random_scores(x.shape, dtype, "cuda", generator_seed=1)
    torch.full_like(x, float("nan"))  # freed at once: the allocator hands its memory to y next
    y = sms.scaled_mask_softmax(x, None, 0.5, True, causal_variant)
    torch.full_like(x, float("nan"))  # and to dx
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, None, 0.5, True, causal_variant, dy)
    assert_outputs_match(y, x.grad, y_ref, dx_ref, dy, dtype, 0.5)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.bfloat16])
def test_rows_narrowed_to_what_they_see_keep_their_mask(mask_dtype):
    """Causal bf16 rows of 65,536 columns that see at most 300 keys (upper-left), with a mask over queries and keys:
    the kernels take the first 320 columns of x and of the mask."""
    x = random_scores((2, 300, 65536), torch.bfloat16, "cuda").requires_grad_()
    mask = random_scores((300, 65536), torch.bfloat16, "cuda", generator_seed=4)
    if mask_dtype == torch.bool:
        mask = mask > -0.5
    assert_forward_backward_match(x, mask, 0.5, is_causal=True)


def key_mask_at(cols, offset):
    """A bool key mask of `cols` keys, the first 8 attended, starting `offset` bytes past a 16-byte boundary. Off a
    boundary, forward_staged cannot copy its rows in bulk: the causal rows it would take go to two passes instead."""
    keep = torch.rand((cols + offset,), generator=torch.Generator().manual_seed(3)) > 0.3
    keep[offset:offset + 8] = True
    mask = keep.to("cuda")[offset:]
    assert mask.data_ptr() % 16 == offset
    return mask


def test_rows_narrowed_to_what_they_see_can_still_take_two_passes():
    """fp32 causal rows of 32,768 columns that see up to 8192 keys (upper-left): narrowed to their first 8192
    columns, which a key mask off 16-byte words sends to the two-pass forward, which then writes rows of y 32,768
    elements apart."""
    x = random_scores((8192, 32768), torch.float32, "cuda").requires_grad_()
    assert_forward_backward_match(x, key_mask_at(32768, offset=4), 0.5, is_causal=True)


# 2050 fp16 columns: rows not 16-byte aligned, whose narrowed backward writes the rest of dx in 2-byte words.
@pytest.mark.parametrize("dtype, queries, cols", [(torch.bfloat16, 6144, 16384), (torch.float32, 3072, 8192),
                                                  (torch.bfloat16, 768, 2048), (torch.float16, 800, 2050)])
def test_causal_rows_that_see_a_quarter_to_half_of_their_keys(dtype, queries, cols):
    """Causal rows (upper-left) that see up to 3/8 of their keys, with a bool key-padding mask: the forward narrows
    them to the columns any of them sees from 2048 columns, the backward from 2048 columns to 16,384, and each writes
    the rest of its output apart. The memory that y then takes is left holding NaN first, so that a zero not written
    shows."""
    x = random_scores((queries, cols), dtype, "cuda").requires_grad_()
    mask = (torch.rand(cols, generator=torch.Generator().manual_seed(3)) > 0.3).to("cuda")
    y = assert_forward_backward_match(x, mask, 0.5, is_causal=True)
    assert not y[:, queries:].any()


# Rows that are no whole 16-byte vectors (odd column counts) and see at most half their keys (upper-left): narrowed to
# the columns any of them sees, then read in vectors from the boundary before each row's start (fp32 rows of 9001
# columns no longer whole; bf16 ones a warp a row), the rest of y and dx zeroed in 16-byte words but where a row's
# ends cut them. With a key-padding mask, whose rows start elsewhere in their vectors than x's, and a bias.
@pytest.mark.parametrize("dtype, queries, cols", [(torch.float32, 1000, 9001), (torch.bfloat16, 1000, 9001),
                                                  (torch.float16, 300, 8195), (torch.float32, 60, 8197)])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "bias"])
def test_unaligned_rows_narrowed_to_what_they_see(dtype, queries, cols, mask_form):
    x = random_scores((2, 2, queries, cols), dtype, "cuda").requires_grad_()
    mask = mask_of_form(mask_form, x, key_shape=(2, 1, 1, cols), bias_shape=(2, queries, cols))
    y = assert_forward_backward_match(x, mask, 0.5, is_causal=True)
    assert not y[..., queries:].any() and not x.grad[..., queries:].any()


# Lower-right, more queries than keys: the first Sq - Sk rows see no key. Rows that forward_staged brings into shared
# memory (bf16 of 4096 columns, causal rows of 8 KiB; the backward's backward_staged at 16,384), and fp32 rows of
# 8192 columns with a bool mask not in 16-byte words (the two-pass kernels), and of 8193, whose rows start mid-vector.
@pytest.mark.parametrize("dtype, cols, mask_offset", [(torch.bfloat16, 4096, None), (torch.float32, 8192, 1),
                                                      (torch.bfloat16, 16384, None), (torch.float32, 8193, 1)])
def test_lower_right_rows_that_see_no_key(dtype, cols, mask_offset):
    queries = cols + 96
    x = random_scores((queries, cols), dtype, "cuda").requires_grad_()
    mask = None if mask_offset is None else key_mask_at(cols, mask_offset)
    y = assert_forward_backward_match(x, mask, 0.5, is_causal=True, causal_variant="lower_right")
    assert not y[:queries - cols].any() and not x.grad[:queries - cols].any()


# Upper-left rows narrowed to the columns they see (bf16, 4096 of 16,384 columns; fp32, 8192 of 32,768), long enough
# for the kernels of long causal rows rather than the group kernel (forward_staged; with a key mask off 16-byte words,
# the two-pass kernel), a few of them NaN or +inf where they see: NaN at every column, the zeros past the narrowed
# columns included, as the float64 reference is; the other rows untouched. Rows of 9001 and 8197 columns start
# mid-vector: the kernels that take them from the vector boundary before write the NaN past the narrowed columns.
@pytest.mark.parametrize("dtype, queries, cols, masked", [(torch.bfloat16, 4096, 16384, False),
                                                          (torch.float32, 8192, 32768, False),
                                                          (torch.float32, 8192, 32768, True),
                                                          (torch.float32, 1000, 9001, False),
                                                          (torch.bfloat16, 1000, 8197, True)])
def test_narrowed_rows_that_saw_nan_are_nan_everywhere(dtype, queries, cols, masked):
    x = random_scores((queries, cols), dtype, "cpu")
    nan_rows = [3, queries // 2, queries - 1]
    x[3, 2] = float("nan")
    x[queries // 2, 0] = float("inf")
    x[queries - 1, queries - 5] = float("nan")
    x = x.to("cuda").requires_grad_()
    mask = key_mask_at(cols, offset=4) if masked else None
    y = sms.scaled_mask_softmax(x, mask, 0.5, True)
    dy = random_scores(x.shape, dtype, "cuda", generator_seed=1)
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, mask, 0.5, True, "upper_left", dy)
    others = [row for row in range(queries) if row not in nan_rows]
    assert y[nan_rows].isnan().all() and not y[others].isnan().any()
    assert_close_to(y[others], y_ref[others], dtype)
    assert torch.equal(x.grad.isnan().cpu(), dx_ref.isnan().cpu())
    assert_close_to(x.grad[others], dx_ref[others], dtype, scale=4)


def assert_matches_reference_with(x, mask_form, scale):
    """x's forward and backward against the float64 reference, with `mask_form`: none; a bool key-padding mask over
    the batch, the second batch all masked; an fp32 bias over all but the batch; or causal rows that see the keys of
    a cache before them (lower-right), as when decoding."""
    mask = None
    if mask_form == "key_padding":
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) > 0.3
        mask[1] = False
        mask = mask.to(x.device)
    elif mask_form == "bias":
        mask = random_scores((1,) + x.shape[1:], torch.float32, x.device, generator_seed=2)
    y = assert_forward_backward_match(x, mask, scale, mask_form == "causal", "lower_right")
    assert not y.isnan().any()


def assert_matches_reference_with_a_full_mask(x, mask_dtype, is_causal, mask_shape=None):
    """x's forward and backward against the float64 reference, with a mask of x's shape (or `mask_shape`) in
    `mask_dtype` (bool, or additive) whose row [0, 1, 2] is all masked: that row comes out zero."""
    mask_shape = x.shape if mask_shape is None else mask_shape
    if mask_dtype == torch.bool:
        mask = (torch.rand(mask_shape, generator=torch.Generator().manual_seed(3)) > 0.3).cuda()
        mask[0, 1, 2] = False
    else:
        mask = random_scores(mask_shape, mask_dtype, "cuda", generator_seed=2)
        mask[0, 1, 2] = float("-inf")
    y = assert_forward_backward_match(x, mask, 0.5, is_causal)
    assert not y[0, 1, 2].any() and not x.grad[0, 1, 2].any()


# Rows that forward_staged brings into shared memory (on sm_90), those the register kernel would hold in at most
# two blocks a multiprocessor: 16-bit rows of 16,384 columns, fp32 of 8192 and 16,384, fp64 of 4096; causal rows of
# at least 8 KiB (bf16 of 4096 columns, fp32 of 2048); and in the backward (backward_staged, one stage), the causal
# ones of the first five lengths. 16,376 columns: a bool mask row is not whole 16-byte words there, and
# the register kernel takes it.
@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 16384), (torch.float16, 16384), (torch.bfloat16, 16376),
                                         (torch.float32, 8192), (torch.float32, 16384), (torch.float64, 4096),
                                         (torch.bfloat16, 4096), (torch.float32, 2048)])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "bias", "causal"])
def test_rows_staged_through_shared_memory(dtype, cols, mask_form):
    assert_matches_reference_with(random_scores((2, 3, 5, cols), dtype, "cuda").requires_grad_(), mask_form, 0.7)


# Causal rows of 16,384 16-bit columns (fp32: 8192) with a bool mask whose rows start 8 bytes (fp32: 4) past a 16-byte
# boundary: x is read in 16-byte vectors, but the mask rows are not whole 16-byte words, so forward_staged does not take
# them and they take two passes; beside them the same rows with the mask in words, which forward_staged takes on sm_90.
@pytest.mark.parametrize("dtype, cols, offset", [(torch.bfloat16, 16384, 8), (torch.bfloat16, 16384, 0),
                                                 (torch.float32, 8192, 4), (torch.float32, 8192, 0)])
def test_long_causal_rows_whose_mask_is_not_in_words(dtype, cols, offset):
    x = random_scores((2, 3, 6, cols), dtype, "cuda").requires_grad_()
    keep = torch.rand((2, 1, 1, cols + offset), generator=torch.Generator().manual_seed(3)) > 0.3
    mask = keep.to("cuda")[..., offset:]
    assert mask.data_ptr() % 16 == offset
    assert_forward_backward_match(x, mask, 0.7, True, "lower_right")


# As above, rows taken whole in two passes (mask rows not in words) or staged (in words), each but the last hiding its
# last few keys: one row's visible scores hold +inf, another's NaN. Those rows are NaN at every position, the hidden
# ones included, as the float64 reference is; their gradients NaN where visible and 0 where hidden. Rows of 16,385 and
# 8193 columns start mid-vector: their NaN stops at the row's end, short of the next row's first elements.
@pytest.mark.parametrize("dtype, cols, offset", [(torch.bfloat16, 16384, 8), (torch.bfloat16, 16384, 0),
                                                 (torch.float32, 8192, 4), (torch.float32, 8192, 0),
                                                 (torch.bfloat16, 16385, 8), (torch.float32, 8193, 0)])
def test_long_causal_rows_that_saw_nan_are_nan_everywhere(dtype, cols, offset):
    x = random_scores((6, cols), dtype, "cpu")
    x[1, 0] = float("inf")
    x[2, 7] = float("nan")
    x = x.to("cuda").requires_grad_()
    mask = key_mask_at(cols, offset)
    y = sms.scaled_mask_softmax(x, mask, 0.7, True, "lower_right")
    dy = random_scores(x.shape, x.dtype, x.device, generator_seed=1)
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, mask, 0.7, True, "lower_right", dy)
    assert y[1:3].isnan().all() and not y[[0, 3, 4, 5]].isnan().any()
    assert_close_to(y, y_ref, dtype)
    assert torch.equal(x.grad.isnan().cpu(), dx_ref.isnan().cpu()) and not x.grad[1:3, -1].nan_to_num().any()
    assert_close_to(x.grad[[0, 3, 4, 5]], dx_ref[[0, 3, 4, 5]], dtype, scale=4)


# Many more rows than forward_staged's persistent grid holds at once, so that each block goes round its stages
# several times (the staged tests above give each block one row): on an H200, bf16 rows of 16,384 columns in two
# blocks a multiprocessor, causal rows of 4096 columns in eight.
@pytest.mark.parametrize("shape, mask_form", [((2, 8, 160, 16384), "none"), ((2, 8, 160, 16384), "key_padding"),
                                              ((2, 8, 512, 4096), "causal")])
def test_staged_rows_many_to_a_block(shape, mask_form):
    assert_matches_reference_with(random_scores(shape, torch.bfloat16, "cuda").requires_grad_(), mask_form, 0.7)


def test_one_staged_kernel_given_less_shared_memory_between_launches():
    """A staged kernel launched on rows of 16,384 bf16 columns, then of 15,360 (fewer threads, smaller stages), then
    of 16,384 again: what the launcher keeps from the first launch still allows the third."""
    for cols in (16384, 15360, 16384):
        for mask_form in ("none", "causal"):
            x = random_scores((2, 3, 5, cols), torch.bfloat16, "cuda").requires_grad_()
            assert_matches_reference_with(x, mask_form, 0.7)


# Rows that start mid-vector (a row length not a whole number of 16-byte vectors), read from the vector boundary
# before each row by the register kernels (kShifted): ViT's 197 columns, Swin's 49, a decoding step's 1037 keys, and
# rows up to the longest a block holds (bf16 8191, fp32 4095); causal ones among them short of kCausalTwoPassColumns.
# bf16 rows of 1037 columns and fp32 of 601 span just past a warp's kTargetIters vectors a thread (one warp a row);
# bf16 of 1500, fp32 of 801 and fp16 of 2001 take it at six, seven and eight vectors a thread.
# A key-padding mask's rows start elsewhere in their vectors than x's (read across two vectors), a bias's in some
# rows and not others; a full mask's as x's (read in vectors). The second batch all masked by the key-padding mask.
@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, (2, 3, 5, 197)), (torch.float16, (2, 4, 3, 49)),
                                          (torch.float32, (2, 3, 5, 197)), (torch.bfloat16, (2, 8, 1, 1037)),
                                          (torch.float32, (2, 3, 5, 601)), (torch.bfloat16, (2, 3, 5, 1500)),
                                          (torch.float32, (2, 3, 5, 801)), (torch.float16, (2, 3, 5, 2001)),
                                          (torch.bfloat16, (2, 2, 3, 8191)), (torch.float32, (2, 2, 3, 4095)),
                                          (torch.float16, (2, 3, 33, 3))])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "bias", "causal"])
def test_rows_that_start_mid_vector(dtype, shape, mask_form):
    assert_matches_reference_with(random_scores(shape, dtype, "cuda").requires_grad_(), mask_form, 0.7)


# Short rows that start mid-vector, the operands' rows contiguous and a whole number of runs, whose backward without a
# causal limit takes flat runs (backward_flat): a warp reads and writes a run of rows as whole vectors however the rows
# fall in them. Swin's 49 columns (runs of eight rows, 49 vectors); fp32 rows of 50 (runs of two rows, doubled to
# four); rows of 9 and 12 (runs of 32 rows, a row within one vector or across two); rows of 97, 127 and fp32 63 (a
# run of up to 128 vectors, four a lane). Causal rows, lower-right with more queries than keys, see none at first and
# come out zero. 2x3x5x49: 30 rows, no whole number of runs, taken from the vector boundary before each row instead.
@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, (2, 4, 49, 49)), (torch.float16, (2, 2, 8, 9)),
                                          (torch.float32, (2, 3, 8, 50)), (torch.bfloat16, (2, 4, 16, 12)),
                                          (torch.bfloat16, (2, 2, 16, 97)), (torch.float16, (2, 1, 8, 127)),
                                          (torch.float32, (2, 2, 4, 63)), (torch.bfloat16, (2, 3, 5, 49))])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "bias", "causal"])
def test_short_rows_in_flat_runs(dtype, shape, mask_form):
    assert_matches_reference_with(random_scores(shape, dtype, "cuda").requires_grad_(), mask_form, 0.7)


@pytest.mark.parametrize("dtype, mask_dtype", [(torch.bfloat16, torch.bool), (torch.bfloat16, torch.bfloat16),
                                               (torch.float16, torch.float32), (torch.float32, torch.float32)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_short_rows_in_flat_runs_with_a_full_mask(dtype, mask_dtype, is_causal):
    """A mask of x's shape, beside a backward in flat runs; a row all masked comes out zero."""
    assert_matches_reference_with_a_full_mask(random_scores((2, 3, 8, 49), dtype, "cuda").requires_grad_(), mask_dtype,
                                              is_causal)


# Rows that start on a 16-byte boundary and span 129-256 vectors, which one warp holds at five to eight vectors a
# thread (register_plan), forward and causal backward (the backward of 16-bit and fp32 rows without a causal limit
# rereads them instead; fp64's is held too): bf16 rows of 1088, 1536, 1792 and 2048 columns, fp16 of 1160, fp32 of
# 600 and 1000, fp64 of 300.
@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 1088), (torch.bfloat16, 1536), (torch.bfloat16, 1792),
                                         (torch.bfloat16, 2048), (torch.float16, 1160), (torch.float32, 600),
                                         (torch.float32, 1000), (torch.float64, 300)])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "bias", "causal"])
def test_rows_one_warp_holds_past_four_vectors_a_thread(dtype, cols, mask_form):
    assert_matches_reference_with(random_scores((2, 3, 5, cols), dtype, "cuda").requires_grad_(), mask_form, 0.7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("is_causal", [False, True])
def test_rows_that_start_mid_vector_with_a_full_mask(dtype, mask_dtype, is_causal):
    """A mask of x's shape starts each row as far into its vector as x's, and is read in vectors with it; rows all
    masked come out zero."""
    assert_matches_reference_with_a_full_mask(random_scores((2, 3, 7, 197), dtype, "cuda").requires_grad_(),
                                              mask_dtype, is_causal)


# A bias over heads and queries whose rows start as far into their vectors as x's: a batch of x is a whole number of
# vectors, so every batch's rows lie against the bias as the first's (rows_shifted_alike), read one vector of it for
# each of x's (ScoreLoader's MaskPlacement::kAlike); rows of two, four (197 columns) and five to seven vectors a thread.
@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, (2, 8, 3, 197)), (torch.float16, (3, 8, 3, 49)),
                                          (torch.float32, (2, 4, 3, 197)), (torch.bfloat16, (2, 8, 3, 1037)),
                                          (torch.bfloat16, (2, 8, 3, 1500)), (torch.float32, (2, 4, 3, 801))])
@pytest.mark.parametrize("mask_dtype", [torch.bool, "x's", torch.float32])
@pytest.mark.parametrize("is_causal", [False, True])
def test_rows_that_start_mid_vector_with_a_bias_as_far_into_its_vectors(dtype, shape, mask_dtype, is_causal):
    x = random_scores(shape, dtype, "cuda").requires_grad_()
    assert_matches_reference_with_a_full_mask(x, dtype if mask_dtype == "x's" else mask_dtype, is_causal,
                                              mask_shape=(1, *shape[1:]))


@pytest.mark.parametrize("dtype, mask_dtype", [(torch.bfloat16, torch.bool), (torch.bfloat16, torch.bfloat16),
                                               (torch.bfloat16, torch.float32), (torch.float32, torch.bool),
                                               (torch.float32, torch.float32)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_rows_that_start_mid_vector_with_a_mask_elsewhere_in_its_vectors(dtype, mask_dtype, is_causal):
    """A mask of x's shape whose rows each start `offset` elements further into their vectors than x's, for every
    offset a vector allows: read two vectors at a time and shifted into place; the last rows, whose vectors would
    pass the mask's end, from a copy of its tail."""
    x = random_scores((2, 3, 5, 197), dtype, "cuda").requires_grad_()
    for offset in range(1, 16 // dtype.itemsize):
        storage = random_scores((x.numel() + offset,), torch.float32, "cuda", generator_seed=offset)
        if mask_dtype == torch.bool:
            storage = storage > -1.0
        mask = storage.to(mask_dtype)[offset:].view(x.shape)
        mask[1, 2, 3] = False if mask_dtype == torch.bool else float("-inf")
        x.grad = None
        y = assert_forward_backward_match(x, mask, 0.5, is_causal)
        assert not y[1, 2, 3].any() and not x.grad[1, 2, 3].any()


# A mask that repeats over the outermost dims and lies within them as x does, where each of x's batches starts
# elsewhere in its vectors than the one before: written out over the fewest batches that span whole vectors (2 at 12
# heads of 3x197 bf16, 8 at 3 heads of 5x13 fp16, 4 at fp32's, 8 for a mask over queries at 4 heads of 5x13), each
# batch taking its copy; but at 2 a floating one is read as half vectors (the next test). A bias over heads and
# queries in x's dtype, fp32 and bool, causal or not; the learnable one's gradient too.
@pytest.mark.parametrize("dtype, shape, mask_dims, mask_dtype", [
    (torch.bfloat16, (16, 12, 3, 197), 3, torch.bfloat16), (torch.bfloat16, (32, 12, 3, 197), 3, torch.float32),
    (torch.bfloat16, (16, 12, 3, 197), 3, torch.bool), (torch.float16, (64, 3, 5, 13), 3, torch.float16),
    (torch.float32, (32, 3, 5, 13), 3, torch.float32), (torch.bfloat16, (16, 4, 5, 13), 2, torch.bfloat16)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_masks_repeated_over_batches_that_start_elsewhere_in_their_vectors(dtype, shape, mask_dims, mask_dtype,
                                                                           is_causal):
    x = random_scores(shape, dtype, "cuda").requires_grad_()
    mask = random_scores(shape[-mask_dims:], torch.float32, "cuda", generator_seed=2)
    mask = mask > -1.0 if mask_dtype == torch.bool else mask.to(mask_dtype)
    assert_forward_backward_match(x, mask, 0.5, is_causal, "lower_right")
    if mask_dtype == torch.float32:
        x.grad = None
        assert_learnable_bias_matches(x, mask, is_causal)


# A floating mask whose rows start as far into their vectors as x's or half a vector further, read as two half vectors
# for each of x's with no copy: a bias over 12 heads of 3x197 (bf16 and fp16 x; 4 elements past a whole number of
# 16-bit vectors a batch) and 4 heads of 49x49, fp32 x over 2 heads of 3x197 and of 49x49 (2 past), in x's dtype and
# fp32; odd batch counts, which a copy over two batches would not take. Causal or not; the learnable bias's gradient.
@pytest.mark.parametrize("dtype, shape, mask_dtype", [
    (torch.bfloat16, (5, 12, 3, 197), torch.bfloat16), (torch.float16, (3, 12, 3, 197), torch.float32),
    (torch.bfloat16, (7, 4, 49, 49), torch.bfloat16), (torch.float32, (5, 2, 3, 197), torch.float32),
    (torch.float32, (3, 2, 49, 49), torch.float32)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_masks_half_a_vector_apart(dtype, shape, mask_dtype, is_causal):
    x = random_scores(shape, dtype, "cuda").requires_grad_()
    mask = random_scores(shape[1:], mask_dtype, "cuda", generator_seed=2)
    assert_forward_backward_match(x, mask, 0.5, is_causal, "lower_right")
    if mask_dtype == torch.float32:
        x.grad = None
        assert_learnable_bias_matches(x, mask, is_causal)


@pytest.mark.parametrize("x_offset, dy_offset", [(1, 0), (0, 3), (8, 8)])
def test_rows_that_start_mid_vector_unlike_the_output(x_offset, dy_offset):
    """x (or dy) starting `offset` elements into a 16-byte vector: its rows start elsewhere in their vectors than y's
    (or dx's), except at an offset of a whole vector, and are read element by element instead."""
    shape, cols = (3, 5, 197), 197
    x = random_scores((shape[0] * shape[1] * cols + 16,), torch.bfloat16, "cuda")
    x = x[x_offset:x_offset + shape[0] * shape[1] * cols].view(shape).requires_grad_()
    assert x.data_ptr() % 16 == x_offset * 2 % 16
    y = sms.scaled_mask_softmax(x, None, 0.5)
    dy_storage = random_scores((x.numel() + 16,), torch.bfloat16, "cuda", generator_seed=1)
    dy = dy_storage[dy_offset:dy_offset + x.numel()].view(shape)
    y.backward(dy)
    y_ref, dx_ref, _ = reference_forward_backward(x, None, 0.5, False, "upper_left", dy)
    assert_outputs_match(y, x.grad, y_ref, dx_ref, dy, torch.bfloat16, 0.5)


# Rows that forward_staged_in_cluster takes on sm_90 (those the cluster register kernels would), each block's slice
# brought into shared memory a row ahead, eight vectors a thread: bf16 at 65,536 columns in 2 blocks, at 131,080 and
# 262,144 in 8 (131,080: the last slice partly filled); fp32 at 65,536 in 4, at 100,000 in 8. With an fp32 bias, in
# as many more as two stages of a slice need: bf16 at 65,536 in 4, fp32 at 65,536 in 8; bf16 at 262,144, whose two
# stages would take 16, in 8 with one stage. A bool mask's rows as any other's.
@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 65536), (torch.bfloat16, 131080), (torch.bfloat16, 262144),
                                         (torch.float32, 65536), (torch.float32, 100000)])
@pytest.mark.parametrize("mask_form", ["none", "key_padding", "bias"])
def test_long_rows_staged_in_clusters(dtype, cols, mask_form):
    assert_matches_reference_with(random_scores((2, 3, cols), dtype, "cuda").requires_grad_(), mask_form, 0.3)


# Many more rows than the clusters that hold them at once, so that each cluster goes round its stages and its
# exchanges of max and sum several times (the tests above give each cluster one row): on an H200, bf16 rows of
# 65,536 columns in clusters of 2 or 4 blocks, of 262,144 in 8 (with a bias, one stage each).
@pytest.mark.parametrize("shape, mask_form", [((2, 400, 65536), "none"), ((2, 400, 65536), "key_padding"),
                                              ((2, 400, 65536), "bias"), ((2, 80, 262144), "none"),
                                              ((2, 80, 262144), "key_padding"), ((2, 80, 262144), "bias")])
def test_long_rows_many_to_a_cluster(shape, mask_form):
    assert_matches_reference_with(random_scores(shape, torch.bfloat16, "cuda").requires_grad_(), mask_form, 0.3)


# Rows whose two stages of x and a full mask would take clusters of 16 blocks take one stage over clusters of 8: bf16
# rows of 262,144 columns with a bf16 or an fp32 mask, fp32 rows of 131,072 with an fp32 one; more rows than clusters,
# so that a stage is sent for again while the cluster exchanges the row before.
@pytest.mark.parametrize("dtype, cols, mask_dtype", [(torch.bfloat16, 262144, torch.bfloat16),
                                                     (torch.bfloat16, 262144, torch.float32),
                                                     (torch.float32, 131072, torch.float32)])
def test_long_rows_with_a_full_mask_in_one_stage(dtype, cols, mask_dtype):
    x = random_scores((2, 40, cols), dtype, "cuda").requires_grad_()
    mask = random_scores((2, 40, cols), mask_dtype, "cuda", generator_seed=2)
    assert_forward_backward_match(x, mask, 0.3)


# fp64 rows with a bias held in the registers of a cluster's blocks (forward_in_cluster; the staged cluster kernel
# takes no fp64): 32,768 columns in 8 blocks, 65,536 in 8 at eight vectors a thread. The same kernel takes the other
# dtypes' rows with an additive mask where a device holds no staged cluster of them.
@pytest.mark.parametrize("cols", [32768, 65536])
def test_fp64_rows_in_the_registers_of_a_cluster(cols):
    assert_matches_reference_with(random_scores((2, 3, cols), torch.float64, "cuda").requires_grad_(), "bias", 0.3)


def test_more_long_rows_than_the_l2_holds():
    """More long rows than the two-pass kernels may take at once and still find in L2 what their first pass read,
    with a mask shared over the batch and larger than half of an H100's or H200's L2 (42 MB), which has them take
    rows in the mask's order (RowOrder)."""
    cols = 65536
    x = random_scores((3, 320, cols), torch.bfloat16, "cuda").requires_grad_()
    mask = random_scores((320, cols), torch.bfloat16, "cuda", generator_seed=2)
    assert_forward_backward_match(x, mask, 0.3)


def test_rows_of_a_bias_taken_in_its_order():
    """Rows that blocks hold in registers with a bias that repeats over the batch, where the bias and a batch's x and
    y (16 + 32 MB) exceed a quarter of an H100's or H200's L2, which has them take rows in the bias's order."""
    x = random_scores((4, 16, 512, 512), torch.float32, "cuda").requires_grad_()
    bias = random_scores((16, 512, 512), torch.float32, "cuda", generator_seed=2)
    assert_forward_backward_match(x, bias, 0.3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_mask", [False, True])
def test_two_pass_rows_on_either_side_of_the_folded_shift(dtype, with_mask):
    """16-bit rows in two passes (no mask, or a bool mask; 65,535 columns, read element by element, which the staged
    cluster kernel does not take) write 2^(s * log2(e) - total), the total folding in the shift and log2 of the sum,
    only where that total is within 1024, and exp(s - shift) / sum elsewhere: rows whose scores sit on either side
    of it (scale 1: a shift of 650 gives a total about 950, 760 about 1110), a row all -inf and a row with a NaN."""
    cols = 65535
    centers = [0.0, -300.0, 650.0, 760.0, -1000.0, 3000.0]
    rows = [random_scores((cols,), torch.float64, "cpu", generator_seed=seed) + center
            for seed, center in enumerate(centers)]
    x = torch.stack(rows + [torch.full((cols,), float("-inf"), dtype=torch.float64), rows[0].clone()])
    x[-1, cols // 3] = float("nan")
    x = x.to(dtype)
    mask = None
    if with_mask:
        mask = torch.rand(x.shape, generator=torch.Generator().manual_seed(3)) > 0.1
        mask[0] = False  # a row all masked by the mask
    y = sms.scaled_mask_softmax(x.cuda(), None if mask is None else mask.cuda(), 1.0)
    assert_close_to(y, scaled_mask_softmax_reference(x, mask, 1.0), dtype)


def test_runs_on_the_current_stream():
    """On a side stream, x is written after a long sleep there and read by the operator after it: a launch on
    another stream would read x before the write."""
    x = torch.zeros((64, 1024), dtype=torch.float16, device="cuda")
    scores = random_scores(x.shape, torch.float16, "cuda")
    expected = sms.scaled_mask_softmax(scores, is_causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # about 50 ms
        x.copy_(scores)
        y = sms.scaled_mask_softmax(x, is_causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(y, expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_second_gpu():
    x = random_scores((4, 8, 300), torch.float32, "cuda:1").requires_grad_()
    mask = torch.zeros(300, device="cuda:1")
    with torch.cuda.device(0):
        y = sms.scaled_mask_softmax(x, mask, 0.5, True)
        y.sum().backward()
    assert y.device == torch.device("cuda:1")
    y_ref, _, _ = reference_forward_backward(x, mask, 0.5, True, "upper_left", torch.ones_like(x))
    assert_close_to(y, y_ref, torch.float32)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_staged_rows_on_two_gpus():
    """The launchers keep the runtime's answers about a launch per device: rows that the staged kernels take on
    sm_90 (16,384 bf16 columns, and 65,536 split over a cluster), on one GPU, then the other, then the first again."""
    for device in ("cuda:0", "cuda:1", "cuda:0"):
        for cols in (16384, 65536):
            for mask_form in ("none", "causal"):
                x = random_scores((2, 3, cols), torch.bfloat16, device).requires_grad_()
                assert_matches_reference_with(x, mask_form, 0.5)


# (1, 4, 262144), upper-left: four queries see so few keys of rows so long that the kernels take only their first
# 64 columns, the rest zeroed apart. Without a mask, causal bf16 rows (lower-right: whole, not narrowed) that a staged
# kernel takes, whose blocks draw their rows from a counter zeroed before each launch: forward_staged's (4, 64, 4096),
# backward_staged's (2, 8, 16384); and rows without a causal limit drawn by clusters of two blocks (2, 400, 65536).
# Replayed three times, with new scores each time: a counter zeroed only once would leave the later replays' rows
# undrawn.
@pytest.mark.parametrize("shape, with_mask, causal_variant", [((8, 16, 128), True, "upper_left"),
                                                              ((1, 4, 262144), True, "upper_left"),
                                                              ((4, 64, 4096), False, "lower_right"),
                                                              ((2, 8, 16384), False, "lower_right"),
                                                              ((2, 400, 65536), False, None)])
def test_cuda_graph_capture_and_replay(shape, with_mask, causal_variant):
    is_causal = causal_variant is not None
    causal_variant = causal_variant or "upper_left"
    x = random_scores(shape, torch.bfloat16, "cuda").requires_grad_()
    mask = torch.zeros(shape[-2:], dtype=torch.bfloat16, device="cuda") if with_mask else None
    dy = random_scores(x.shape, torch.bfloat16, "cuda", generator_seed=2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside the graph, as CUDA graph capture requires
            x.grad = None
            sms.scaled_mask_softmax(x, mask, 0.5, is_causal, causal_variant).backward(dy)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        y = sms.scaled_mask_softmax(x, mask, 0.5, is_causal, causal_variant)
        y.backward(dy)
    for seed in (3, 4, 5):
        with torch.no_grad():
            x.copy_(random_scores(x.shape, torch.bfloat16, "cuda", generator_seed=seed))
        graph.replay()
        y_ref, dx_ref, _ = reference_forward_backward(x, mask, 0.5, is_causal, causal_variant, dy)
        assert_outputs_match(y, x.grad, y_ref, dx_ref, dy, torch.bfloat16, 0.5)


# A learnable bias's backward (backward_with_bias_grad) captured and replayed, and run again eagerly, bit for bit the
# same: a bias of one row, all 2048 rows' (summed in as many parts as fill the device, which ATen adds), one shared by
# a batch of four (parts of up to four rows each), and one of x's shape (one part).
@pytest.mark.parametrize("bias_shape", [(128,), (1, 8, 64, 128), (4, 8, 64, 128)], ids=["keys", "heads", "full"])
def test_learnable_bias_in_cuda_graphs_and_deterministic(bias_shape):
    x = random_scores((4, 8, 64, 128), torch.bfloat16, "cuda").requires_grad_()
    bias = random_scores(bias_shape, torch.float32, "cuda", generator_seed=1).requires_grad_()
    dy = random_scores(x.shape, torch.bfloat16, "cuda", generator_seed=2)

    def gradients():
        x.grad = bias.grad = None
        sms.scaled_mask_softmax(x, bias, 0.5).backward(dy)
        return x.grad, bias.grad

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside the graph, as CUDA graph capture requires
            gradients()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dx, dbias = gradients()
    for seed in (3, 4):
        with torch.no_grad():
            x.copy_(random_scores(x.shape, torch.bfloat16, "cuda", generator_seed=seed))
        graph.replay()
        replayed = dx.clone(), dbias.clone()
        eager = gradients()
        assert torch.equal(eager[0], replayed[0]) and torch.equal(eager[1], replayed[1])
        _, dx_ref, dbias_ref = reference_forward_backward(x, bias, 0.5, False, "upper_left", dy)
        assert_close_to(replayed[0], dx_ref, torch.bfloat16, scale=4)
        assert_close_to(replayed[1], dbias_ref, torch.bfloat16, scale=4 * x.numel() // bias.numel())


# A learnable bias on rows beyond a cluster's registers, whose score gradients ATen sums and scales into dx: bf16 rows
# of whole vectors past 65,536 columns (eight blocks of 256 threads at four vectors each), and past 16,384 where
# they start mid-vector (element by element, 512 threads); causal too.
@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 65544), (torch.bfloat16, 16391), (torch.float32, 40000)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_learnable_bias_beyond_a_cluster(dtype, cols, is_causal):
    x = random_scores((2, 3, cols), dtype, "cuda").requires_grad_()
    assert_learnable_bias_matches(x, random_scores((cols,), torch.float32, "cuda", generator_seed=4), is_causal)


# A learnable bias on short rows that start mid-vector, whose backward without a causal limit takes flat runs and sums
# the bias's gradient in them (backward_flat_with_bias_grad): Swin's 49 columns, with a bias over keys (runs of eight
# rows, each of them a period of the bias's rows), over queries (49 rows: periods of 392 rows), over heads and queries
# (196 rows: a period of two of the bias's), and of x's shape; fp16 rows of 9 (runs of 32 rows), fp32 rows of 50 (runs
# of four), bf16 rows of 97 (four vectors a lane).
@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, (2, 4, 49, 49)), (torch.float16, (2, 2, 16, 9)),
                                          (torch.float32, (2, 3, 8, 50)), (torch.bfloat16, (2, 2, 16, 97))])
@pytest.mark.parametrize("bias_dims", [1, 2, 3, 4], ids=["keys", "queries", "heads", "full"])
def test_learnable_bias_in_flat_runs(dtype, shape, bias_dims):
    x = random_scores(shape, dtype, "cuda").requires_grad_()
    assert_learnable_bias_matches(x, random_scores(shape[-bias_dims:], torch.float32, "cuda", generator_seed=4), False)


def assert_learnable_bias_matches(x, bias, is_causal):
    """y, x's gradient and the fp32 bias's (summed over the dims it is broadcast along) against the float64
    reference."""
    bias.requires_grad_()
    y = sms.scaled_mask_softmax(x, bias, 0.6, is_causal, "lower_right")
    dy = random_scores(x.shape, x.dtype, "cuda", generator_seed=1)
    y.backward(dy)
    y_ref, dx_ref, dbias_ref = reference_forward_backward(x, bias, 0.6, is_causal, "lower_right", dy)
    assert_outputs_match(y, x.grad, y_ref, dx_ref, dy, x.dtype, 0.6)
    assert bias.grad.dtype == torch.float32
    assert_close_to(bias.grad, dbias_ref, x.dtype, scale=4 * x.numel() // bias.numel())


# Rows of 64 to 2048 16-byte vectors without a causal limit, which the backward reads twice in a block a row (bf16 at
# 512 and 8192 columns: one and two vectors a thread of 512; at 8200 and 16,384 in blocks of 1024; fp32 at 256, 4096
# and 8192), and their neighbours outside, which the register kernels take (bf16 at 504 and 16,392, fp32 at 252 and
# 8196); dy as its own tensor (rows evenly spaced), and as a view whose rows are spaced apart.
@pytest.mark.parametrize("dtype, cols", [(torch.bfloat16, 504), (torch.bfloat16, 512), (torch.bfloat16, 8192),
                                         (torch.bfloat16, 8200), (torch.bfloat16, 16384), (torch.bfloat16, 16392),
                                         (torch.float16, 1024), (torch.float32, 252), (torch.float32, 256),
                                         (torch.float32, 4096), (torch.float32, 8192), (torch.float32, 8196)])
@pytest.mark.parametrize("dy_layout", ["contiguous", "transposed"])
def test_backward_rows_read_twice(dtype, cols, dy_layout):
    y = torch.softmax(random_scores((3, 7, cols), torch.float32, "cuda"), -1).to(dtype)
    dy = random_scores((7, 3, cols), dtype, "cuda", generator_seed=1).transpose(0, 1)
    if dy_layout == "contiguous":
        dy = dy.contiguous()
    dx = torch.ops.scaled_mask_softmax.backward(y, dy, 0.7)
    y64, dy64 = y.double(), dy.double()
    expected = 0.7 * y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
    assert_close_to(dx, expected, dtype, scale=4)


@pytest.mark.parametrize("cols", [100, 1024, 8192, 50000])
def test_bitwise_deterministic(cols):
    x = random_scores((256, cols), torch.bfloat16, "cuda")
    dy = random_scores(x.shape, torch.bfloat16, "cuda", generator_seed=1)
    first = sms.scaled_mask_softmax(x, is_causal=True)
    first_dx = torch.ops.scaled_mask_softmax.backward(first, dy, 0.5)
    for _ in range(3):
        assert torch.equal(sms.scaled_mask_softmax(x, is_causal=True), first)
        assert torch.equal(torch.ops.scaled_mask_softmax.backward(first, dy, 0.5), first_dx)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        on_stream = sms.scaled_mask_softmax(x, is_causal=True)
        on_stream_dx = torch.ops.scaled_mask_softmax.backward(first, dy, 0.5)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(on_stream, first) and torch.equal(on_stream_dx, first_dx)


CLUSTER_BLOCKS_SCRIPT = """
import json, sys, torch
import scaled_mask_softmax as sms
from torch.profiler import profile, ProfilerActivity
cases = torch.load(sys.argv[1])
results = []
for x, mask, dy in cases:
    x = x.cuda().requires_grad_()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y = sms.scaled_mask_softmax(x, None if mask is None else mask.cuda(), 0.3)
        y.backward(dy.cuda())
        torch.cuda.synchronize()
    prof.export_chrome_trace(sys.argv[2])
    grids = {event["name"]: event["args"]["grid"][0] for event in json.load(open(sys.argv[2]))["traceEvents"]
             if event.get("cat") == "kernel" and "_in_cluster" in event["name"]}
    results.append((y.detach().cpu(), x.grad.cpu(), grids))
torch.save(results, sys.argv[1])
"""


# Rows split over clusters in the count the device holds most rows at once of (most_resident_wide), 9-16 blocks on an
# H100 or H200, run in a process told SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS=1: every cluster kernel then takes at most
# 8 blocks a row, as on a device without larger clusters, and the rows still match the float64 reference.
@pytest.mark.parametrize("portable", [False, True])
def test_clusters_held_to_the_portable_size(portable, tmp_path):
    rows = 2  # fewer than the clusters the device holds at once: a launch's grid is then its rows' blocks
    cases = []
    for cols, mask_form in ((262144, "full"), (131077, "key_padding")):
        x = random_scores((rows, cols), torch.bfloat16, "cpu")
        mask = mask_of_form(mask_form, x, key_shape=(cols,))
        cases.append((x, mask, random_scores(x.shape, x.dtype, "cpu", generator_seed=1)))
    torch.save(cases, tmp_path / "cases.pt")
    settings = {"SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS": "1" if portable else "0"}
    subprocess.run([sys.executable, "-c", CLUSTER_BLOCKS_SCRIPT, tmp_path / "cases.pt", tmp_path / "trace.json"],
                   env=environment_importing_this_package(**settings), check=True, timeout=600)
    most_blocks = 0
    for (x, mask, dy), (y, dx, grids) in zip(cases, torch.load(tmp_path / "cases.pt")):
        y_ref, dx_ref, _ = reference_forward_backward(x, mask, 0.3, False, "lower_right", dy)
        assert_outputs_match(y, dx, y_ref, dx_ref, dy, x.dtype, 0.3)
        most_blocks = max([most_blocks] + [grid // rows for grid in grids.values()])
    if portable:
        assert most_blocks <= 8
    elif torch.cuda.get_device_capability() == (9, 0):
        assert most_blocks > 8, "these rows no longer take larger clusters: choose others"


def test_first_call_of_a_process_compiled_with_fullgraph():
    """In a process of its own, so that no eager call has loaded the CUDA kernels first."""
    script = """
import torch
import scaled_mask_softmax as sms
x = torch.randn(2, 4, 256, 256, device="cuda", dtype=torch.bfloat16)
y = torch.compile(lambda x: sms.scaled_mask_softmax(x, None, 0.125, True), fullgraph=True)(x)
expected = sms.scaled_mask_softmax_reference(x.double(), None, 0.125, True)
torch.testing.assert_close(y.double(), expected, atol=8e-3, rtol=1.6e-2)
"""
    subprocess.run([sys.executable, "-c", script], env=environment_importing_this_package(), check=True, timeout=600)


def test_torch_compile_on_cuda_matches_eager():
    torch._dynamo.reset()
    x = random_scores((2, 4, 256, 256), torch.bfloat16, "cuda")
    mask = torch.zeros(2, 1, 1, 256, dtype=torch.bool, device="cuda")
    mask[..., :200] = True
    compiled = torch.compile(lambda x, m: sms.scaled_mask_softmax(x, m, 0.125, True), fullgraph=True)
    assert torch.equal(compiled(x, mask), sms.scaled_mask_softmax(x, mask, 0.125, True))
