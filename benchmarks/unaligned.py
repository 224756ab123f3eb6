"""Rows that start mid-vector (a row length that is not a whole number of 16-byte vectors): ours on the rows as they
come, read in vectors from the boundary before each row, against the same rows moved one element past a boundary
(x for the forward, y for the backward), which are read element by element. Each over the byte floor, the copy
ceiling measured in the same run.

    python benchmarks/unaligned.py [--grid 64x12x197x197,1024x4x49x49] [--dtype bfloat16] [--variants none,bias]
"""
import argparse

import torch

from scaled_mask_softmax import bench, scaled_mask_softmax

SCALE = 0.125


def off_boundary(tensor):
    """A copy of `tensor` whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    moved = storage[1:].view(tensor.shape)
    moved.copy_(tensor)
    return moved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=bench.parse_grid, default=bench.parse_grid("64x12x197x197,1024x4x49x49"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", type=bench.comma_list(tuple(bench.VARIANTS)), default=tuple(bench.VARIANTS))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    copy_per_ms = bench.copy_bytes_per_ms(device)
    print(f"{args.dtype}, copy {copy_per_ms / 1e6:.0f} GB/s; ms (over the floor): in vectors, element by element")
    generator = torch.Generator(device).manual_seed(0)
    for shape, _ in args.grid:
        for variant in args.variants:
            x, mask, _, is_causal = bench.make_inputs(shape, dtype, variant, device, generator)
            y = scaled_mask_softmax(x, mask, SCALE, is_causal)
            dy = torch.randn(shape, generator=generator, device=device, dtype=dtype)
            passes = {
                "fwd": lambda x: scaled_mask_softmax(x, mask, SCALE, is_causal),
                "bwd": lambda y: torch.ops.scaled_mask_softmax.backward(y, dy, SCALE, is_causal),
            }
            for pass_name, run in passes.items():
                operand = x if pass_name == "fwd" else y
                moved = off_boundary(operand)
                floor = bench.necessary_bytes_of(pass_name, x, mask, is_causal) / copy_per_ms
                vectors = bench.median_ms(lambda: run(operand), device)
                elements = bench.median_ms(lambda: run(moved), device)
                cell = f"{'x'.join(map(str, shape)):16} {variant:12} {pass_name:4}"
                print(f"{cell} {vectors:8.4f} ({vectors / floor:5.2f}x) {elements:8.4f} ({elements / floor:5.2f}x)"
                      f"  {elements / vectors:5.2f}x faster")


if __name__ == "__main__":
    main()
