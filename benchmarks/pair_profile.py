"""One launch of ours and one of a peer's kernel for the same pass and inputs, inside a profiler range, so that
Nsight Compute sets them side by side (benchmarks/NOTES.md, after v14):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats python benchmarks/pair_profile.py 2x16x4096x4096:bwd 8x32x1024x1024:fwd

Each argument is a cell, `BxHxSqxSk:pass` (bf16 unless --dtype says otherwise; --variant as the benchmark's).
The peer is torch.compile's kernel, or with --peer plain benchmarks/plain.py's, which moves the same bytes and
computes nothing.
"""
import argparse

import torch

import plain
from scaled_mask_softmax import bench, scaled_mask_softmax

SCALE = 0.125
WARM_UP_CALLS = 5


def cell(text):
    shape, _, pass_name = text.partition(":")
    if pass_name not in ("fwd", "bwd"):
        raise argparse.ArgumentTypeError(f"a cell is BxHxSqxSk:fwd or BxHxSqxSk:bwd, got {text!r}")
    return bench.parse_grid(shape)[0][0], pass_name


def peer_calls(peer, x, mask, peer_mask, is_causal, y, dy):
    """{"fwd": fn, "bwd": fn} of the peer: torch.compile's (compiled at its first call) or the plain kernels."""
    if peer == "plain":
        return plain.movers(x, mask, is_causal, y, dy)
    forward = torch.compile(bench.eager_composite, dynamic=False)
    backward = torch.compile(bench.softmax_backward_composite, dynamic=False)
    return {"fwd": lambda: forward(x, peer_mask, SCALE, is_causal), "bwd": lambda: backward(y, dy, SCALE)}


def pair(shape, pass_name, dtype, variant, peer, generator):
    """Ours and the peer for one cell, both warmed up (torch.compile compiles and tunes here)."""
    x, mask, peer_mask, is_causal = bench.make_inputs(shape, dtype, variant, torch.device("cuda"), generator)
    with torch.no_grad():
        y = scaled_mask_softmax(x, mask, SCALE, is_causal)
    dy = torch.randn_like(y)
    x.requires_grad_()  # as the benchmark times the forward
    ours = {"fwd": lambda: scaled_mask_softmax(x, mask, SCALE, is_causal),
            "bwd": lambda: torch.ops.scaled_mask_softmax.backward(y, dy, SCALE, is_causal)}
    calls = (ours[pass_name], peer_calls(peer, x, mask, peer_mask, is_causal, y, dy)[pass_name])
    for _ in range(WARM_UP_CALLS):
        for call in calls:
            call()
    return calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cells", nargs="+", type=cell)
    parser.add_argument("--dtype", default="bfloat16", choices=bench.DTYPES)
    parser.add_argument("--variant", default="none", choices=tuple(bench.ALL_VARIANTS))
    parser.add_argument("--peer", default="compile", choices=("compile", "plain"))
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(0)
    pairs = [pair(shape, pass_name, getattr(torch, args.dtype), args.variant, args.peer, generator)
             for shape, pass_name in args.cells]
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for calls in pairs:
        for call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
