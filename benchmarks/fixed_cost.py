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

for our passes on the cells given (as the benchmark calls them), torch.compile's beside them with --peers, and
torch's copy of x. Run on a GPU:
  python benchmarks/fixed_cost.py --grid 256x16x128x128,16x16x512x512 --variants none,causal
  python benchmarks/fixed_cost.py --grid 8x32x1024x1024 --variants none,additive --passes fwd,bwd --peers
"""
import argparse
import statistics

import torch

from scaled_mask_softmax import bench, scaled_mask_softmax
from traffic import median_ms_clean_flush

REPEATS = 50


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
    parser.add_argument("--passes", type=bench.comma_list(("fwd", "bwd")), default=["fwd"])
    parser.add_argument("--peers", action="store_true", help="time torch.compile's call the same ways")
    args = parser.parse_args()
    device = torch.device("cuda")
    copy = bench.copy_bytes_per_ms(device)
    generator = torch.Generator(device=device).manual_seed(0)
    print(f"copy ceiling {copy / 1e6:.0f} GB/s")
    print(f"{'call':42}{'floor':>9}{'zeroing':>9}{'reading':>9}{'chained':>9}{'zero/fl':>8}{'chain/fl':>9}{'us more':>8}")
    one = torch.zeros(1, device=device)
    report("a one-element kernel", None, lambda: one.add_(1))
    for shape, dtype_name, variant in bench.cells(args.grid, args.dtypes, args.variants):
        dtype = getattr(torch, dtype_name)
        x, mask, peer_mask, is_causal = bench.make_inputs(shape, dtype, variant, device, generator)
        dy = torch.randn(shape, generator=generator, device=device, dtype=dtype)
        x.requires_grad_()  # as the benchmark times every pass
        compiled = torch.compile(bench.eager_composite, dynamic=False)
        compiled_backward = torch.compile(bench.softmax_backward_composite, dynamic=False)
        with torch.no_grad():
            y = scaled_mask_softmax(x, mask, bench.SCALE, is_causal)
        for pass_name in args.passes:
            floor_ms = bench.necessary_bytes_of(pass_name, x, mask, is_causal) / copy
            calls = bench.implementations(pass_name, x, mask, peer_mask, is_causal, y, dy, compiled, compiled_backward)
            report(f"{'x'.join(map(str, shape))} {dtype_name} {variant} {pass_name}", floor_ms, calls["ours_ms"])
            if args.peers:
                report("  torch.compile", floor_ms, calls["compile_ms"])
        copied = torch.empty_like(y)
        report("  torch copy of x", 2 * y.numel() * y.element_size() / copy, lambda: copied.copy_(y))
        del x, mask, peer_mask, dy, y, copied
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
