"""What a timed call costs beyond its kernel's own run, on the benchmark's shortest cells.

The benchmark times each call as do_bench does: CUDA events around one launch, after a flush that zeroes a buffer
larger than the L2. On the cells whose floor is about 50-65 us (x of 128 MiB), a cost that does not grow with the
bytes weighs 5-10% of the floor. This script times the same launches four ways, in ms:

  events, zeroing flush   as the benchmark (bench.median_ms: do_bench's median)
  events, reading flush   the flush leaves clean lines in L2 instead of dirty ones (benchmarks/traffic.py)
  back to back            REPEATS launches between two events, no flush: a launch's share, its start hidden
                          behind the one before (the tensors are several times the L2, so each launch still
                          reads from DRAM)
  a one-element kernel   a launch that moves next to nothing, timed the same ways: the events' own floor

for our forward on the cells given, and torch's copy of the same size. Run on a GPU:
  python benchmarks/fixed_cost.py --grid 256x16x128x128,16x16x512x512 --variants none,causal
"""
import argparse
import statistics

import torch

from scaled_mask_softmax import bench, scaled_mask_softmax
from traffic import median_ms_clean_flush

REPEATS = 50
SCALE = 0.125


def back_to_back_ms(fn):
    fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPEATS):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / REPEATS)
    return statistics.median(times)


def report(name, floor_ms, fn):
    """One line: the floor, the three timings, the first and the last over the floor, and their difference in us."""
    zeroing = bench.median_ms(fn, torch.device("cuda"))
    reading = median_ms_clean_flush(fn)
    chained = back_to_back_ms(fn)
    ratios = f"{zeroing / floor_ms:8.3f}{chained / floor_ms:9.3f}" if floor_ms else f"{'-':>8}{'-':>9}"
    print(f"{name:42}{floor_ms or 0:9.4f}{zeroing:9.4f}{reading:9.4f}{chained:9.4f}{ratios}"
          f"{(zeroing - chained) * 1e3:8.1f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", type=bench.parse_grid, default=bench.parse_grid("256x16x128x128,16x16x512x512"))
    parser.add_argument("--dtypes", type=bench.comma_list(bench.DTYPES), default=["bfloat16"])
    parser.add_argument("--variants", type=bench.comma_list(tuple(bench.ALL_VARIANTS)), default=["none", "causal"])
    args = parser.parse_args()
    device = torch.device("cuda")
    copy = bench.copy_bytes_per_ms(device)
    generator = torch.Generator(device=device).manual_seed(0)
    print(f"copy ceiling {copy / 1e6:.0f} GB/s")
    print(f"{'call':42}{'floor':>9}{'zeroing':>9}{'reading':>9}{'chained':>9}{'zero/fl':>8}{'chain/fl':>9}{'us more':>8}")
    one = torch.zeros(1, device=device)
    report("a one-element kernel", None, lambda: one.add_(1))
    for shape, dtype_name, variant in bench.cells(args.grid, args.dtypes, args.variants):
        x, mask, _, is_causal = bench.make_inputs(shape, getattr(torch, dtype_name), variant, device, generator)
        floor_ms = bench.necessary_bytes_of("fwd", x, mask, is_causal) / copy
        report(f"{'x'.join(map(str, shape))} {dtype_name} {variant} fwd", floor_ms,
               lambda: scaled_mask_softmax(x, mask, SCALE, is_causal))
        y = torch.empty_like(x)
        report("  torch copy of x", 2 * x.numel() * x.element_size() / copy, lambda: y.copy_(x))
        del x, mask, y
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
