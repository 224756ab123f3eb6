"""python -m scaled_mask_softmax check: the correctness matrix against the float64 reference.

Each mask form of the benchmark (none, a full additive mask, causal, both, a bool key-padding mask [B,1,1,Sk], a
bias [1,H,Sq,Sk]) in fp32, fp16 and bf16 at 128, 512 and 1024 columns, on every available device, forward and
backward, and the bias's gradient (it is learnable); exits 0 only if every row passes.
"""
import argparse

import torch

from .ops import scaled_mask_softmax
from .reference import scaled_mask_softmax_reference

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MASKS = ("none", "additive", "causal", "causal+additive", "key_padding", "bias")
ROW_LENGTHS = (128, 512, 1024)
QUICK_ROW_LENGTHS = (128,)
# Batch and heads per device: the CPU kernels and the float64 reference are slow on a few cores.
MATRICES = {"cpu": (1, 2), "cuda": (2, 4)}
# Attention's scale for a head dim of 64, with scores x of the matching spread (q.k over 64 dims).
SCALE = 0.125
X_SPREAD = 8.0
MASKED_FRACTION = 0.1

# Absolute tolerance of y, whose values lie in [0, 1]. Rounding y to fp16 / bf16 costs at most half an ulp of
# the values just below 1 (2^-12 / 2^-9), so the tolerance is twice that, which is also the relative rounding
# of any y. fp32 leaves room for exp and the row sum computed in fp32.
FORWARD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2**-11, torch.bfloat16: 2**-8}
# dx = scale * y * (dy - sum(dy * y)) is computed from the rounded y and rounded itself; each of the three
# roundings moves dx by at most (relative rounding) * |scale| * max|dy| * (1 or 2), hence the factor 5.
BACKWARD_ROUNDINGS = 5


def backward_tolerance(dtype, scale, dy):
    return BACKWARD_ROUNDINGS * FORWARD_TOLERANCE[dtype] * abs(scale) * dy.abs().max().item()


def make_inputs(shape, dtype, mask_name, generator):
    """x, the mask (None; additive 0 / -inf of x's shape and dtype; bool [B,1,1,Sk], True = attend; or a bias
    [1,H,Sq,Sk] of x's dtype), is_causal and dy; made on the CPU."""
    x = (torch.randn(shape, generator=generator, dtype=torch.float64) * X_SPREAD).to(dtype)
    dy = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    mask = None
    if "additive" in mask_name:
        masked = torch.rand(shape, generator=generator) < MASKED_FRACTION
        # Key 0 stays visible so that no row is fully masked, even under the causal mask.
        masked[..., 0] = False
        mask = torch.zeros(shape, dtype=dtype).masked_fill(masked, float("-inf"))
    elif mask_name == "key_padding":
        attend = torch.rand((shape[0], 1, 1, shape[-1]), generator=generator) >= MASKED_FRACTION
        attend[..., 0] = True
        mask = attend
    elif mask_name == "bias":
        mask = torch.randn((1, *shape[1:]), generator=generator, dtype=torch.float64).to(dtype)
    return x, mask, "causal" in mask_name, dy


def max_abs_error(ours, reference):
    # NaN propagates through max, so a NaN anywhere fails the comparison.
    return (ours.double() - reference).abs().max().item()


def check_case(device, dtype, row_length, mask_name, generator):
    """The forward and backward rows of one case: (pass, error, tolerance)."""
    batch, heads = MATRICES[device]
    shape = (batch, heads, row_length, row_length)
    x, mask, is_causal, dy = make_inputs(shape, dtype, mask_name, generator)
    x, dy = x.to(device), dy.to(device)
    mask = None if mask is None else mask.to(device)

    learnable = mask_name == "bias"
    x_ours = x.clone().requires_grad_()
    mask_ours = mask.clone().requires_grad_() if learnable else mask
    y = scaled_mask_softmax(x_ours, mask_ours, SCALE, is_causal)
    y.backward(dy)

    x_reference = x.double().requires_grad_()
    mask_reference = mask.double().requires_grad_() if learnable else mask
    y_reference = scaled_mask_softmax_reference(x_reference, mask_reference, SCALE, is_causal)
    y_reference.backward(dy.double())

    rows = [
        ("fwd", max_abs_error(y.detach(), y_reference.detach()), FORWARD_TOLERANCE[dtype]),
        ("bwd", max_abs_error(x_ours.grad, x_reference.grad), backward_tolerance(dtype, SCALE, dy)),
    ]
    if learnable:
        # The scores' gradient without the scale, summed over the batch: each term within the backward's
        # tolerance at scale 1, the sum within batch times that.
        rows.append(("bias", max_abs_error(mask_ours.grad, mask_reference.grad),
                     batch * backward_tolerance(dtype, 1.0, dy)))
    return rows


def available_devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaled_mask_softmax check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), help="one device (default: every available one)")
    parser.add_argument("--quick", action="store_true", help=f"row length {QUICK_ROW_LENGTHS[0]} only")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check: --device cuda was asked for, but torch sees no CUDA device")
        return 2
    devices = [args.device] if args.device else available_devices()
    row_lengths = QUICK_ROW_LENGTHS if args.quick else ROW_LENGTHS

    print(f"y = softmax(x * {SCALE} + mask) against the float64 reference; batch x heads per device: "
          + ", ".join(f"{d} {'x'.join(map(str, MATRICES[d]))}" for d in devices))
    header = (f"{'device':7} {'dtype':9} {'S':>5}  {'mask':16} {'pass':4} {'max abs error':>13} {'tolerance':>10}"
              "  result")
    print(header)
    print("-" * len(header))
    generator = torch.Generator().manual_seed(0)
    passed = total = 0
    for device in devices:
        for dtype in DTYPES:
            for row_length in row_lengths:
                for mask_name in MASKS:
                    for pass_name, error, tolerance in check_case(device, dtype, row_length, mask_name, generator):
                        ok = error <= tolerance
                        passed += ok
                        total += 1
                        print(f"{device:7} {str(dtype).removeprefix('torch.'):9} {row_length:5}  {mask_name:16} "
                              f"{pass_name:4} {error:13.3e} {tolerance:10.3e}  {'PASS' if ok else 'FAIL'}",
                              flush=True)
    print(f"{passed}/{total} rows passed")
    return 0 if passed == total else 1
