"""Runs every CUDA kernel variant once, forward and backward: for compute-sanitizer (scripts/sanitize.sh).

Each dtype x mask type x row length below reaches one instantiation and dispatch branch: vector loads, rows that
start mid-vector (an odd row length: read in vectors from the boundary before each row, from a padded copy of the
operand's last bytes where a vector would pass its end, as the last row's does; a mask row two vectors at a time
where it starts elsewhere in its vector than x's, as some rows of a mask broadcast over the batch do; at 1023, 1500
and 2001 columns, past a warp's four vectors a thread in 16-bit types, one warp at five, six and eight; rows that
start on a boundary likewise at 1088 and 2048 columns, at five and eight), element-wise loads (x one element off a
vector boundary, whose rows start elsewhere in their vectors than y's), a group of lanes per row, a block per row in
registers (on sm_90, where few such blocks fit a multiprocessor, and causal rows of 8 KiB or more, brought into
shared memory by bulk copies first: forward, 16384 in 16-bit types and fp32 but not causal, 2048 in fp64 and causal
fp32; backward, causal rows of 16384 in 16-bit types and of 8192 in fp32), a row split over the blocks of a cluster
on sm_90 each holding its slice in registers (20000 and 65536 without a causal limit: the backward but in fp64 at
65536, the forward with an additive mask that the staged kernel below does not take; at eight vectors a thread where
16 blocks would take four, the forward in clusters of 8, the backward in as few blocks as hold the row: fp32 at
100000 (7), 16-bit at 131080 (5); in the forward, each slice brought into shared memory first where its mask is
whole 16-byte words, or without a mask from the vector boundary before a row that starts mid-vector), and the
two-pass kernels, a block per row (causal rows) or split over the blocks of a cluster (the other forwards, the fp64
backward at 65536; causal rows that start mid-vector, 40001, in vectors from the boundary before each row, and fp64
ones element by element); causal rows that see few of their keys, narrowed to the columns they can see, the rest of
their output zeroed apart (NaN where a row saw a NaN); the backward of short rows that start mid-vector read and
written as flat runs of whole vectors; a mask repeated over batches that start elsewhere in their vectors, written
out over a few of them, or read as half vectors where they start half a vector apart.
Results are compared with the float64 reference, so a run that the sanitizer passes is also a correct one. Last, a
learnable bias (backward_with_bias_grad).
"""
import sys

import torch

import scaled_mask_softmax as sms
from scaled_mask_softmax.reference import scaled_mask_softmax_reference

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
ROW_LENGTHS = (1, 7, 64, 197, 1000, 1023, 1088, 1500, 2001, 2048, 3001, 8192, 16384, 20000, 40001, 65536, 100000,
               131080)
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def masks_for(dtype, rows, cols):
    """One mask of each type the kernels read: none, bool, x's dtype, and fp32 (x's compute type)."""
    attend = torch.rand(rows, cols, device="cuda") > 0.2
    additive = torch.zeros(rows, cols, device="cuda").masked_fill(~attend, float("-inf"))
    return {"none": None, "bool": attend, "same": additive.to(dtype), "float32": additive}


def failed(x, mask, mask_name, is_causal, causal_variant):
    """One forward and backward, the forward compared with the float64 reference; True (and a line) if it is off."""
    x.grad = None
    y = sms.scaled_mask_softmax(x, mask, 0.5, is_causal, causal_variant)
    y.backward(torch.ones_like(y))
    expected = scaled_mask_softmax_reference(x.detach().double(), mask, 0.5, is_causal, causal_variant)
    nan = expected.isnan()
    error = (y.double() - expected).masked_fill(nan, 0).abs().max().item()
    nan_alike = torch.equal(y.isnan(), nan)
    if error <= TOLERANCE[x.dtype] and nan_alike:
        return False
    print(f"FAIL {x.dtype} cols={x.shape[-1]} mask={mask_name} causal={is_causal} {causal_variant}: error {error:.3g}"
          f"{'' if nan_alike else ', NaN where the reference is not or not where it is'}")
    return True


def learnable_bias_failed(dtype, cols, is_causal, batch=5):
    """A bias [3, cols] shared by a batch of 5 rows each (backward_with_bias_grad: a group of lanes, a block, rows
    that start mid-vector at 7 and 197 columns, in vectors but in fp64, and beyond a block's registers at 9000, 9001
    and, in fp32, 8192: in a cluster's but in fp64), its gradient against the reference's. A batch of 16 at 49
    columns: flat runs (backward_flat_with_bias_grad) without a causal limit."""
    x = torch.randn(batch, 3, cols, device="cuda", dtype=dtype).requires_grad_()
    bias_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    bias = torch.randn(3, cols, device="cuda", dtype=bias_dtype).requires_grad_()
    dy = torch.randn_like(x)
    sms.scaled_mask_softmax(x, bias, 0.5, is_causal, "lower_right").backward(dy)
    bias64 = bias.detach().double().requires_grad_()
    expected = scaled_mask_softmax_reference(x.detach().double(), bias64, 0.5, is_causal, "lower_right")
    expected.backward(dy.double())
    error = (bias.grad.double() - bias64.grad).abs().max().item()
    if error <= TOLERANCE[dtype] * bias64.grad.abs().max().item():
        return False
    print(f"FAIL {dtype} cols={cols} learnable bias causal={is_causal}: bias gradient off by {error:.3g}")
    return True


def main() -> int:
    failures = 0
    for dtype in DTYPES:
        for cols in ROW_LENGTHS:
            rows = 3
            x = torch.randn(2, rows, cols, device="cuda", dtype=dtype).requires_grad_()
            for mask_name, mask in masks_for(dtype, rows, cols).items():
                for is_causal in (False, True):
                    failures += failed(x, mask, mask_name, is_causal, "lower_right")
            if cols in (7, 197, 3001):
                moved = torch.randn(2, rows, cols + 1, device="cuda", dtype=dtype)[..., 1:].requires_grad_()
                failures += failed(moved, masks_for(dtype, rows, cols)["bool"], "bool", False, "lower_right")
        # Causal rows that see few of their keys (upper-left, three queries), which the two-pass kernels would take:
        # the kernels take their first 64 columns and zero_spans the rest of y and dx (at 65537, where rows start
        # mid-vector, the words a row's ends cut an element at a time; at 8195, 700 queries, narrowed to 704 columns
        # read from the vector boundary before each row). A row that sees a NaN is NaN throughout: its kernel writes
        # NaN over the zeros, up to the row's end. At 4099, 600 queries, too short to be narrowed, the rows start
        # mid-vector and come into shared memory from the vector boundary before each (forward_staged's kShifted).
        for queries, cols in ((3, 20000), (3, 65537), (3, 262144), (700, 8195), (600, 4099)):
            x = torch.randn(2, queries, cols, device="cuda", dtype=dtype)
            x[1, 2, 1] = float("nan")
            x.requires_grad_()
            failures += failed(x, None, "none", True, "upper_left")
    # Rows whose two stages would take clusters of 16 take one stage over clusters of 8 (16-bit rows of 262,144
    # columns and fp32 rows of 131,072 with an additive mask); more rows than clusters, so that a stage is sent for
    # again while the cluster exchanges the row before.
    for dtype, cols in ((torch.bfloat16, 262144), (torch.float32, 131072)):
        x = torch.randn(2, 20, cols, device="cuda", dtype=dtype).requires_grad_()
        for mask_name, mask in masks_for(dtype, 20, cols).items():
            if mask is not None and mask.dtype != torch.bool:
                failures += failed(x, mask, mask_name, False, "lower_right")
    # More rows than the staged kernels' persistent grid holds at once (fp32 rows of 16,384 columns: on an H200 one
    # block a multiprocessor in the forward), so that each block goes round its stages.
    x = torch.randn(400, 16384, device="cuda").requires_grad_()
    for is_causal in (False, True):
        failures += failed(x, None, "none", is_causal, "lower_right")
    # And of 16,385 columns, which start mid-vector: split over a cluster's blocks, each slice copied from the vector
    # boundary before its row, none past the row's last vector (x's last row's from its tail copy).
    x = torch.randn(400, 16385, device="cuda").requires_grad_()
    failures += failed(x, None, "none", False, "lower_right")
    # Short rows that start mid-vector, whose backward takes flat runs (backward_flat) without a causal limit: 16 rows
    # of 49 and 97 columns, a run's vectors two and four a lane (fp32 rows of 97 are too long for them). With eight
    # rows a batch, a batch is a whole number of vectors, so the masks over the rows start as far into their vectors
    # as x's, and the forward reads one vector of them for each of x's (MaskPlacement::kAlike): here, at 197 and
    # 1500 columns (four and six vectors a thread), and at 20,001 (a cluster's blocks, or two passes where causal).
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for cols in (49, 97, 197, 1500, 20001):
            x = torch.randn(2, 8, cols, device="cuda", dtype=dtype).requires_grad_()
            for mask_name, mask in masks_for(dtype, 8, cols).items():
                for is_causal in (False, True):
                    failures += failed(x, mask, mask_name, is_causal, "lower_right")
    # A mask repeated over the batch, whose batches start elsewhere in their vectors, written out over the fewest
    # batches that span whole vectors (repeat_mask_alike): 128 batches of 3 rows of 197 columns.
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(128, 3, 197, device="cuda", dtype=dtype).requires_grad_()
        for mask_name, mask in masks_for(dtype, 3, 197).items():
            if mask is not None:
                failures += failed(x, mask, mask_name, False, "lower_right")
    # A floating mask repeated over batches that each start as far into their vectors as the first or half a vector
    # further, read as half vectors (MaskPlacement::kHalfApart), none past the mask's end: 16-bit x of 4 rows of 197
    # columns a batch, fp32 x of 2 (788 and 394 elements, half a vector past a whole number of them).
    for dtype, rows in ((torch.float16, 4), (torch.bfloat16, 4), (torch.float32, 2)):
        x = torch.randn(6, rows, 197, device="cuda", dtype=dtype).requires_grad_()
        for mask_name, mask in masks_for(dtype, rows, 197).items():
            if mask is not None and mask.dtype != torch.bool:
                for is_causal in (False, True):
                    failures += failed(x, mask, mask_name, is_causal, "lower_right")
    for dtype in DTYPES:
        for cols in (7, 64, 197, 1000, 8192, 9000, 9001):
            failures += learnable_bias_failed(dtype, cols, False) + learnable_bias_failed(dtype, cols, True)
        failures += learnable_bias_failed(dtype, 49, False, batch=16)
    torch.cuda.synchronize()
    print(f"sanitizer cases: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
