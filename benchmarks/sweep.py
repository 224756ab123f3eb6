"""Ours alone over the benchmark grid, as time over the floor: the quick measure for comparing builds.

    python benchmarks/sweep.py --tag main --out sweep.jsonl [--min-cols 1024] [--variants bias,causal]
    python benchmarks/sweep.py --tag main --grid 64x32x2048x16,4x32x4096x8192 --dtypes bfloat16,float32
    python benchmarks/sweep.py --table sweep.jsonl

Prints one line a cell and appends the same as JSON to --out. No peers are timed; the copy ceiling is measured
once per run. --kernels adds each kernel's time per call (bench.kernel_times): the launches a call makes, a copy or
a memset beside ours among them; --launches, each launch's grid, block and registers a thread (how the launchers
split the cell). --plain times, in place of ours, plain kernels that move the same bytes and compute nothing
(benchmarks/plain.py), and needs none of our CUDA kernels. --table prints a file's cells side by side, a column per
tag, the median of its runs. scripts/variants.sh sweeps each build in turns, ROUNDS times.
"""
import argparse
import collections
import json
import statistics

import torch

from scaled_mask_softmax import bench, scaled_mask_softmax

SCALE = 0.125


def cells(args):
    """(shape, dtype name, variant) of the grid within the arguments' bounds."""
    grid = [(shape, dtypes) for shape, dtypes in args.grid if args.min_cols <= shape[-1] <= args.max_cols]
    return bench.cells(grid, args.dtypes, args.variants or tuple(bench.VARIANTS))


def print_table(path):
    """A row per cell, a column per tag: time over the floor, the median of the tag's runs of the cell."""
    runs = collections.defaultdict(list)
    tags = []
    for line in open(path):
        row = json.loads(line)
        tags += [row["tag"]] if row["tag"] not in tags else []
        cell = ("x".join(map(str, row["shape"])), row["dtype"], row["variant"], row["pass"])
        runs[cell, row["tag"]].append(row["over_floor"])
    widths = [max(10, len(tag) + 2) for tag in tags]
    print(f"{'cell':45}" + "".join(f"{tag:>{width}}" for tag, width in zip(tags, widths)))
    for cell in dict.fromkeys(cell for cell, _ in runs):
        figures = [runs.get((cell, tag)) for tag in tags]
        print(f"{' '.join(cell):45}" + "".join(f"{statistics.median(f):{width}.3f}" if f else f"{'-':>{width}}"
                                                for f, width in zip(figures, widths)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", help="print this JSON-lines file's cells side by side, and time nothing")
    parser.add_argument("--tag", default="", help="names the build in the output")
    parser.add_argument("--out", help="a JSON-lines file to append to")
    parser.add_argument("--grid", type=bench.parse_grid, default=bench.GRIDS["default"],
                        help="as bench's --grid: a grid's name, or shapes like 8x32x1024x1024 separated by commas")
    parser.add_argument("--min-cols", type=int, default=0)
    parser.add_argument("--max-cols", type=int, default=1 << 30)
    parser.add_argument("--dtypes", type=bench.comma_list(bench.DTYPES), default=None)
    parser.add_argument("--variants", type=bench.comma_list(tuple(bench.ALL_VARIANTS)), default=None)
    parser.add_argument("--passes", type=bench.comma_list(("fwd", "bwd")), default=["fwd", "bwd"])
    parser.add_argument("--plain", action="store_true", help="time benchmarks/plain.py's kernels instead of ours")
    parser.add_argument("--kernels", action="store_true", help="also each kernel's time per call")
    parser.add_argument("--launches", action="store_true", help="also each launch's grid, block and registers")
    parser.add_argument("--device", default="cuda", help="cpu only to try the script")
    args = parser.parse_args()
    if args.table:
        print_table(args.table)
        return

    if args.plain:
        import plain  # it needs Triton, which --table and a try-out on the CPU do without
    device = torch.device(args.device)
    copy = bench.copy_bytes_per_ms(device)
    generator = torch.Generator(device=device).manual_seed(0)
    out = open(args.out, "a") if args.out else None
    for shape, dtype_name, variant in cells(args):
        x, mask, _, is_causal = bench.make_inputs(shape, getattr(torch, dtype_name), variant, device, generator)
        if args.plain:
            y, dy = torch.randn_like(x), torch.randn_like(x)
            runs = plain.movers(x, mask, is_causal, y, dy)
        else:
            y = scaled_mask_softmax(x, mask, SCALE, is_causal)
            dy = torch.randn_like(y)
            runs = {"fwd": lambda: scaled_mask_softmax(x, mask, SCALE, is_causal),
                    "bwd": lambda: torch.ops.scaled_mask_softmax.backward(y, dy, SCALE, is_causal)}
        for pass_name in args.passes:
            ms = bench.median_ms(runs[pass_name], device)
            floor_ms = bench.necessary_bytes_of(pass_name, x, mask, is_causal) / copy
            row = {"tag": args.tag, "shape": list(shape), "dtype": dtype_name,
                   "variant": variant, "pass": pass_name, "ours_ms": ms, "over_floor": ms / floor_ms}
            print(f"{args.tag:10} {'x'.join(map(str, shape)):18} {row['dtype']:9} {variant:11} {pass_name} "
                  f"{ms / floor_ms:5.2f}", flush=True)
            if args.kernels:
                row["kernel_us"] = {name: 1e3 * kernel_ms
                                    for name, kernel_ms in bench.kernel_times(runs[pass_name], device).items()}
                for name, us in sorted(row["kernel_us"].items(), key=lambda item: -item[1]):
                    print(f"    {us:8.1f} us  {name[:100]}", flush=True)
            if args.launches:
                row["launches"] = bench.kernel_launches(runs[pass_name], device)
                for launch in row["launches"]:
                    print(f"    grid {launch['grid']} block {launch['block']} {launch['registers']:3} registers  "
                          f"{launch['name'][:80]}", flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
        del x, mask, y, dy
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
