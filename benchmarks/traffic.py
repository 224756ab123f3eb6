"""What the device memory sustains for the mixes of reads and writes that the op's passes make, against the copy
ceiling that the benchmark's floor divides by. Each mix is a Triton kernel that does nothing else:

  copy          reads x, writes y (one byte read for each written, as the ceiling's copy); torch's copy again at
                128 and 512 MiB, the sizes of x in the benchmark's cells of 128-512 and 1024 columns, where a
                kernel's start and drain weigh more than in the ceiling's 1 GiB
  write         writes y (as a causal row's zeros past its visible keys); torch's zero_ (a memset); and a
                program a row of 65,536 or 262,144 columns writing it in a loop, as the two-pass kernels write the
                zeros of causal rows that see few of their keys (the benchmark's 4096 x 65,536 and 1024 x 262,144
                causal cells, whose forwards are timed after them)
  read          reads x
  causal copy   each row reads the keys it sees and writes all of y's row: the causal forward's bytes in a plain
                tiled kernel, without its arithmetic (benchmarks/plain.py)

The op's forward, with and without a causal limit, is timed beside the causal copy at each row length. Each is
timed twice: as the benchmark times (triton's do_bench, whose L2 flush zeroes a buffer before each run, leaving
dirty lines that the timed kernel then writes back) and with a flush that reads the buffer (clean lines). Rates
are the bytes that must move (bench.necessary_bytes) per second; their ratio to the ceiling is 1 / (time over
the floor). Run on a GPU: python benchmarks/traffic.py
"""
import statistics
import sys

import torch
import triton
import triton.language as tl
import triton.testing

import plain
import scaled_mask_softmax as sms
from scaled_mask_softmax import bench

BLOCK = 4096
ELEMENTS = 1 << 29  # 1 GiB of bf16
FLUSH_BYTES = 256 << 20
REPEATS = 50


@triton.jit
def copy_kernel(x, y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offsets, tl.load(x + offsets, mask=offsets < n), mask=offsets < n)


@triton.jit
def write_kernel(y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offsets, tl.zeros([BLOCK], dtype=y.dtype.element_ty), mask=offsets < n)


@triton.jit
def row_write_kernel(y, cols, BLOCK: tl.constexpr):
    row = y + tl.program_id(0).to(tl.int64) * cols
    for start in range(0, cols, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        tl.store(row + offsets, tl.zeros([BLOCK], dtype=y.dtype.element_ty), mask=offsets < cols)


@triton.jit
def read_kernel(x, sums, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(sums + tl.program_id(0), tl.sum(values))


def median_ms_clean_flush(fn):
    """do_bench's loop with a flush that reads a buffer larger than the L2 instead of zeroing it."""
    buffer = torch.ones(FLUSH_BYTES // 4, device="cuda")
    sums = torch.empty(triton.cdiv(buffer.numel(), BLOCK), device="cuda")

    def flush():
        read_kernel[(sums.numel(),)](buffer, sums, buffer.numel(), BLOCK=BLOCK)

    for _ in range(5):
        flush()
        fn()
    times = []
    for _ in range(REPEATS):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def both_ways(fn):
    return triton.testing.do_bench(fn, return_mode="median"), median_ms_clean_flush(fn)


def main() -> int:
    x = torch.randn(ELEMENTS, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    size = x.numel() * x.element_size()
    sums = torch.empty(triton.cdiv(x.numel(), BLOCK), device="cuda")
    grid = (triton.cdiv(x.numel(), BLOCK),)
    ceiling = bench.copy_bytes_per_ms(x.device) / 1e6
    print(f"the benchmark's copy ceiling (torch's copy, fp32): {ceiling:.0f} GB/s")
    print(f"{'mix':<30}{'flush':>8}{'GB/s':>8}{'/ ceiling':>11}")

    def report(name, byte_count, times):
        for flush, ms in zip(("zeroes", "reads"), times):
            rate = byte_count / ms / 1e6
            print(f"{name:<30}{flush:>8}{rate:>8.0f}{rate / ceiling:>11.3f}")

    report("copy", 2 * size, both_ways(lambda: copy_kernel[grid](x, y, x.numel(), BLOCK=BLOCK)))
    for fraction in (8, 2):
        part = x.numel() // fraction
        report(f"torch copy, {(size // fraction) >> 20} MiB", 2 * size // fraction,
               both_ways(lambda: y[:part].copy_(x[:part])))
    report("write", size, both_ways(lambda: write_kernel[grid](y, y.numel(), BLOCK=BLOCK)))
    report("write, torch zero_", size, both_ways(lambda: y.zero_()))
    for queries, cols in ((4096, 65536), (1024, 262144)):
        rows = x.numel() // cols
        report(f"write, a program a row of {cols}", size,
               both_ways(lambda: row_write_kernel[(rows,)](y, cols, BLOCK=BLOCK)))
        shape = (1, rows // queries, queries, cols)
        byte_count = bench.necessary_bytes("fwd", shape, x.element_size(), True)
        report(f"causal softmax, {queries} x {cols}", byte_count,
               both_ways(lambda: sms.scaled_mask_softmax(x.view(shape), None, 1.0, True)))
    report("read", size, both_ways(lambda: read_kernel[grid](x, sums, x.numel(), BLOCK=BLOCK)))
    for cols in (128, 1024, 4096, 16384):
        matrices = ELEMENTS // (cols * cols)
        shape = (1, matrices, cols, cols)
        scores = x.view(shape)
        out = y.view(shape)
        byte_count = bench.necessary_bytes("fwd", shape, x.element_size(), True)
        report(f"causal copy, {cols} columns", byte_count,
               both_ways(lambda: plain.launch(scores, None, out, plain.COPY, True)))
        for name, is_causal in (("softmax", False), ("causal softmax", True)):
            byte_count = bench.necessary_bytes("fwd", shape, x.element_size(), is_causal)
            report(f"{name}, {cols} columns", byte_count,
                   both_ways(lambda: sms.scaled_mask_softmax(scores, None, 1.0, is_causal)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
