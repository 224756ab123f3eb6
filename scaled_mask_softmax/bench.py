"""python -m scaled_mask_softmax bench: the operator against eager PyTorch, torch.softmax and torch.compile.

Every cell (shape, dtype, mask variant) is timed forward, backward and forward+backward, and set against the
byte floor: the bytes the pass must move, at the device copy bandwidth measured in the same process.
  forward:  the visible part of x (causal rows read only the keys they see) + the mask's distinct elements
            (under the causal mask, only the visible part of a mask spanning Sq x Sk) + all of y
  backward: the visible part of y and dy + all of dx
  fwd+bwd:  the sum
"""
import argparse
import csv
import datetime
import importlib.util
import json
import math
import pathlib
import platform
import re
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from . import __version__
from .attention import attention
from .ops import scaled_mask_softmax
from .reference import additive_mask, eager_composite

# Attention's scale for a head dim of 64.
SCALE = 0.125
PASSES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("bfloat16", "float16", "float32")
VARIANTS = {
    "none": "no mask",
    "causal": "is_causal, upper_left",
    "additive": "[B,H,Sq,Sk] 0 / -inf in x's dtype, about 10% masked, never a whole row",
    "key_padding": "bool [B,1,1,Sk], True = attend; the last quarter of the keys masked in half the batch",
    "bias": "[1,H,Sq,Sk] ALiBi-like float bias in x's dtype",
}
# Beyond the default grid, for --variants: a mask and the causal limit together, as decoders with padded batches
# or ALiBi run them.
CAUSAL_WITH_MASK = {
    "causal_key_padding": "is_causal, upper_left, and the key_padding mask",
    "causal_bias": "is_causal, upper_left, and the bias",
}
ALL_VARIANTS = {**VARIANTS, **CAUSAL_WITH_MASK}
BF16 = ("bfloat16",)
# Each grid: ([B, H, Sq, Sk], dtypes). The CUDA default spans short rows with many matrices to single rows of
# 262144; the 8x32x1024 cell carries every dtype.
GRIDS = {
    "default": (
        ((256, 16, 128, 128), BF16),
        ((16, 16, 512, 512), BF16),
        ((8, 32, 1024, 1024), DTYPES),
        ((2, 16, 4096, 4096), BF16),
        ((1, 4, 16384, 16384), BF16),
        ((1, 1, 4096, 65536), BF16),
        ((1, 1, 1024, 262144), BF16),
    ),
    "quick": (
        ((8, 32, 1024, 1024), BF16),
        ((2, 16, 4096, 4096), BF16),
    ),
    "cpu": (
        ((4, 4, 128, 128), ("bfloat16", "float32")),
        ((1, 2, 1024, 1024), ("bfloat16", "float32")),
    ),
}
# Tensors of x's size alive at the worst moment of a cell (x, dy, the mask, y, the eager composite's
# intermediates and gradients); a cell whose shape needs more than the free memory is shrunk.
X_SIZED_TENSORS_AT_PEAK = 12
COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 26}
CPU_SECONDS_PER_MEASUREMENT = 0.2
CPU_MAX_REPEATS = 100
E2E_SHAPE = {"cuda": (8, 32, 1024, 64), "cpu": (1, 2, 256, 64)}  # B, H, S, head dim
HOST_OVERHEAD_CALLS = 2000
TIMES = ("ours_ms", "compile_ms", "eager_ms", "softmax_ms", "sdpa_ms")


def visible_elements(shape, is_causal):
    """Elements of `[..., Sq, Sk]` a row must read: under upper_left causal, query i sees min(Sk, i + 1) keys."""
    *batch, rows, cols = shape
    matrices = math.prod(batch)
    if not is_causal:
        return matrices * rows * cols
    triangle = min(rows, cols)
    return matrices * (triangle * (triangle + 1) // 2 + (rows - triangle) * cols)


def mask_elements(mask_shape, x_shape, is_causal):
    """Distinct mask elements that must be read: a broadcast dim counts once; under the causal mask, a mask
    spanning both Sq and Sk is read only where visible."""
    shape = (1,) * (len(x_shape) - len(mask_shape)) + tuple(mask_shape)
    if is_causal and shape[-2:] == tuple(x_shape[-2:]):
        return visible_elements(shape, True)
    return math.prod(shape)


def necessary_bytes(pass_name, x_shape, itemsize, is_causal, mask_shape=None, mask_itemsize=0):
    visible = visible_elements(x_shape, is_causal) * itemsize
    everything = math.prod(x_shape) * itemsize
    mask = 0 if mask_shape is None else mask_elements(mask_shape, x_shape, is_causal) * mask_itemsize
    forward = visible + mask + everything
    backward = 2 * visible + everything
    return {"fwd": forward, "bwd": backward, "fwd+bwd": forward + backward}[pass_name]


def necessary_bytes_of(pass_name, x, mask, is_causal):
    """necessary_bytes for the tensors of a call: x and the mask (or None)."""
    return necessary_bytes(pass_name, tuple(x.shape), x.element_size(), is_causal,
                           None if mask is None else tuple(mask.shape), 0 if mask is None else mask.element_size())


def parse_grid(text):
    """A grid name, or shapes `BxHxSqxSk` separated by commas (bf16 unless --dtypes says otherwise)."""
    if text in GRIDS:
        return GRIDS[text]
    shapes = []
    for item in text.split(","):
        if not re.fullmatch(r"\d+x\d+x\d+x\d+", item):
            raise argparse.ArgumentTypeError(f"--grid takes {', '.join(GRIDS)} or shapes like 8x32x1024x1024, "
                                             f"got {item!r}")
        shapes.append((tuple(int(n) for n in item.split("x")), None))
    return tuple(shapes)


def cells(grid, dtypes=None, variants=tuple(VARIANTS)):
    """(shape, dtype name, variant) for every cell; `dtypes` filters a named grid and sets a shape list's."""
    for shape, grid_dtypes in grid:
        chosen = grid_dtypes if grid_dtypes is not None else (dtypes or BF16)
        for dtype in chosen:
            if dtypes is None or dtype in dtypes:
                for variant in variants:
                    yield shape, dtype, variant


def fit_shape(shape, itemsize, free_bytes):
    """`shape` halved (B, then H, then Sq; never the row length Sk) until a cell of it fits in `free_bytes`."""
    shape = list(shape)
    while X_SIZED_TENSORS_AT_PEAK * math.prod(shape) * itemsize > free_bytes:
        dim = next((d for d in range(3) if shape[d] > 1), None)
        if dim is None:
            break
        shape[dim] //= 2
    return tuple(shape)


def make_inputs(shape, dtype, variant, device, generator):
    """x (random normal, not zeros), ours' mask, the mask as the eager composite adds it, and is_causal."""
    batch, heads, rows, cols = shape
    x = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    is_causal = variant.startswith("causal")
    variant = variant.removeprefix("causal_")
    mask = None
    if variant == "additive":
        masked = torch.rand(shape, generator=generator, device=device, dtype=dtype) < 0.1
        masked[..., 0] = False
        mask = torch.zeros(shape, device=device, dtype=dtype).masked_fill_(masked, float("-inf"))
    elif variant == "key_padding":
        mask = torch.ones(batch, 1, 1, cols, device=device, dtype=torch.bool)
        mask[:(batch + 1) // 2, ..., cols - cols // 4:] = False
    elif variant == "bias":
        slopes = torch.exp2(-8.0 * torch.arange(1, heads + 1, device=device) / heads)
        distance = (torch.arange(rows, device=device, dtype=torch.float32)[:, None]
                    - torch.arange(cols, device=device, dtype=torch.float32)).abs_()
        mask = torch.empty(1, heads, rows, cols, device=device, dtype=dtype)
        for head in range(heads):
            mask[0, head] = distance * -slopes[head]
    # The composite adds its mask: a bool mask reaches it as 0 / -inf, converted once outside the timing, as
    # a model converts its padding mask once per batch.
    peer_mask = additive_mask(mask, dtype) if mask is not None and mask.dtype == torch.bool else mask
    return x, mask, peer_mask, is_causal


def softmax_backward_composite(y, dy, scale):
    return (dy - (dy * y).sum(-1, keepdim=True)) * y * scale


def median_ms(fn, device, grad_to_none=()):
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, grad_to_none=list(grad_to_none) or None, return_mode="median")
    fn()
    times = []
    deadline = time.perf_counter() + CPU_SECONDS_PER_MEASUREMENT
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < CPU_MAX_REPEATS):
        for tensor in grad_to_none:
            tensor.grad = None
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kernel_ms(fn, device, grad_to_none=(), calls=50):
    """The GPU's busy time per call of fn, from the profiler's record of its kernels, copies and memsets: what the
    kernels cost where the host's launches, not the kernels, set the wall time (small shapes). Caches stay warm."""
    return sum(kernel_times(fn, device, grad_to_none, calls).values())


def profiled(call, device, calls):
    """torch's profiler over `calls` calls of `call` (CUDA activity on the GPU, the ops' on the CPU), after five
    calls that keep first-call work (compiling, caching) out of its record."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU]) as profiler:
        for _ in range(calls):
            call()
        synchronize(device)
    return profiler


def kernel_times(fn, device, grad_to_none=(), calls=50):
    """Each kernel's, copy's and memset's time per call of fn, in ms, by name, from the profiler's record (on the
    CPU, each op's own time): which launches a call makes and what each costs. Caches stay warm."""

    def call():
        for tensor in grad_to_none:
            tensor.grad = None
        fn()

    on_gpu = device.type == "cuda"
    own_us = {event.key: event.self_device_time_total if on_gpu else event.self_cpu_time_total
              for event in profiled(call, device, calls).key_averages()}
    return {name: us / calls / 1e3 for name, us in own_us.items() if us > 0}


def kernel_launches(fn, device):
    """The launches one call of fn makes on the GPU, in order: each kernel's name, grid, block and registers a
    thread, as the profiler's trace records them (how a launcher split the work); an empty list on the CPU."""
    if device.type != "cuda":
        return []
    with tempfile.TemporaryDirectory() as folder:
        trace = pathlib.Path(folder) / "trace.json"
        profiled(fn, device, calls=1).export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted((event for event in events if event.get("cat") == "kernel"), key=lambda event: event["ts"])
    return [{"name": event["name"], "grid": event["args"]["grid"], "block": event["args"]["block"],
             "registers": event["args"]["registers per thread"]} for event in kernels]


def copy_bytes_per_ms(device):
    """The copy ceiling: bytes read + written per ms by a device-to-device copy far larger than any cache."""
    source = torch.randn(COPY_BYTES[device.type] // 4, device=device)
    target = torch.empty_like(source)
    ms = median_ms(lambda: target.copy_(source), device)
    return 2 * source.numel() * source.element_size() / ms


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()


def release(device):
    """After a cell: the compiled graphs (and the recompile count, which would otherwise hit dynamo's limit
    and fall back to eager) and the cached device memory."""
    torch._dynamo.reset()
    free_memory(device)


def first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0][:160]


class Measurements:
    """Times each implementation, recording a failure (an out-of-memory above all) instead of raising."""

    def __init__(self, device):
        self.device = device
        self.errors = []

    def time(self, key, fn, grad_to_none=()):
        try:
            return median_ms(fn, self.device, grad_to_none)
        except RuntimeError as error:
            self.errors.append(f"{key.removesuffix('_ms')}: {first_line(error)}")
            free_memory(self.device)
            return None

    def error(self):
        return "; ".join(self.errors) or None


def metadata(device):
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu ({platform.processor() or platform.machine()})"
    return {"gpu": name, "torch": torch.__version__, "version": __version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def device_slug(name):
    """A file name for a device: 'h200' for any H200, otherwise its name in lower case with dashes."""
    if "H200" in name.upper():
        return "h200"
    if name.startswith("cpu"):
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")


def ratio(numerator, denominator):
    return None if numerator is None or not denominator else numerator / denominator


def make_row(shape, dtype, variant, pass_name, times, floor_bytes, copy_per_ms, info, case="softmax", error=None):
    """One stored row; `times` maps TIMES keys to ms (None where not measured)."""
    ours = times.get("ours_ms")
    floor_ms = None if floor_bytes is None else floor_bytes / copy_per_ms
    row = {"case": case, "shape": list(shape), "dtype": dtype, "variant": variant, "pass": pass_name}
    row.update({key: times.get(key) for key in TIMES})
    row.update({
        "floor_ms": floor_ms,
        "copy_GBps": copy_per_ms / 1e6,
        "ours_GBps": None if floor_bytes is None or not ours else floor_bytes / ours / 1e6,
        "ours_over_floor": ratio(ours, floor_ms),
        "speedup_vs_compile": ratio(times.get("compile_ms"), ours),
        "speedup_vs_eager": ratio(times.get("eager_ms"), ours),
        "error": error,
    })
    row.update(info)
    return row


def format_ms(value):
    return f"{value:9.4f}" if value is not None else f"{'-':>9}"


def format_ratio(value):
    return f"{value:7.2f}" if value is not None else f"{'-':>7}"


VARIANT_COLUMN = max(map(len, ALL_VARIANTS))
TABLE_HEADER = (f"{'shape':20} {'dtype':9} {'variant':{VARIANT_COLUMN}} {'pass':7} {'floor_ms':>9} {'ours_ms':>9} "
                f"{'/floor':>7} {'compile':>9} {'eager':>9} {'softmax':>9} {'vs_comp':>7} {'vs_eager':>7}")


def format_row(row):
    line = (f"{'x'.join(map(str, row['shape'])):20} {row['dtype']:9} {row['variant']:{VARIANT_COLUMN}} {row['pass']:7} "
            f"{format_ms(row['floor_ms'])} {format_ms(row['ours_ms'])} {format_ratio(row['ours_over_floor'])} "
            f"{format_ms(row['compile_ms'])} {format_ms(row['eager_ms'])} {format_ms(row['softmax_ms'])} "
            f"{format_ratio(row['speedup_vs_compile'])} {format_ratio(row['speedup_vs_eager'])}")
    return line + (f"  [{row['error']}]" if row["error"] else "")


def implementations(pass_name, x, mask, peer_mask, is_causal, y, dy, compiled, compiled_backward):
    """What each implementation runs for one pass; the peers' backward starts, like ours, from y and dy."""
    dtype = x.dtype
    if pass_name == "fwd":
        return {
            "ours_ms": lambda: scaled_mask_softmax(x, mask, SCALE, is_causal),
            "compile_ms": lambda: compiled(x, peer_mask, SCALE, is_causal),
            "eager_ms": lambda: eager_composite(x, peer_mask, SCALE, is_causal),
            "softmax_ms": lambda: torch.softmax(x, -1),
        }
    if pass_name == "bwd":
        return {
            "ours_ms": lambda: torch.ops.scaled_mask_softmax.backward(y, dy, SCALE, is_causal),
            "compile_ms": lambda: compiled_backward(y, dy, SCALE),
            "eager_ms": lambda: torch._softmax_backward_data(dy, y, -1, dtype) * SCALE,
            "softmax_ms": lambda: torch._softmax_backward_data(dy, y, -1, dtype),
        }
    return {
        "ours_ms": lambda: scaled_mask_softmax(x, mask, SCALE, is_causal).backward(dy),
        "compile_ms": lambda: compiled(x, peer_mask, SCALE, is_causal).backward(dy),
        "eager_ms": lambda: eager_composite(x, peer_mask, SCALE, is_causal).backward(dy),
        "softmax_ms": lambda: torch.softmax(x, -1).backward(dy),
    }


def bench_cell(shape, dtype_name, variant, passes, device, copy_per_ms, info, use_compile):
    """The rows of one cell, one per pass."""
    dtype = getattr(torch, dtype_name)
    try:
        generator = torch.Generator(device=device).manual_seed(0)
        x, mask, peer_mask, is_causal = make_inputs(shape, dtype, variant, device, generator)
        dy = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    except RuntimeError as error:
        free_memory(device)
        return [make_row(shape, dtype_name, variant, p, {}, None, copy_per_ms, info,
                         error=f"inputs: {first_line(error)}") for p in passes]
    # x requires grad in every pass, as in training, so that torch.compile compiles the composite once for
    # fwd and fwd+bwd.
    x.requires_grad_()
    compiled = torch.compile(eager_composite, dynamic=False)
    compiled_backward = torch.compile(softmax_backward_composite, dynamic=False)
    with torch.no_grad():
        y = scaled_mask_softmax(x, mask, SCALE, is_causal)
    skipped = ({"compile_ms"} if not use_compile else set()) | ({"softmax_ms"} if variant != "none" else set())

    rows = []
    for pass_name in passes:
        measurements = Measurements(device)
        candidates = implementations(pass_name, x, mask, peer_mask, is_causal, y, dy, compiled, compiled_backward)
        times = {key: measurements.time(key, fn, grad_to_none=(x,))
                 for key, fn in candidates.items() if key not in skipped}
        floor_bytes = necessary_bytes_of(pass_name, x, mask, is_causal)
        rows.append(make_row(shape, dtype_name, variant, pass_name, times, floor_bytes, copy_per_ms, info,
                             error=measurements.error()))
    return rows


def eager_attention(q, k, v, scale):
    return eager_composite(q @ k.transpose(-2, -1), None, scale, True) @ v


def bench_attention(device, copy_per_ms, info, use_compile):
    """Causal attention forward+backward in bf16: the matmuls around each softmax, and SDPA for scale."""
    batch, heads, length, head_dim = E2E_SHAPE[device.type]
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, grad_out = (torch.randn(batch, heads, length, head_dim, generator=generator, device=device,
                                     dtype=torch.bfloat16) for _ in range(4))
    for tensor in (q, k, v):
        tensor.requires_grad_()
    scale = head_dim ** -0.5
    candidates = {
        "ours_ms": lambda: attention(q, k, v, is_causal=True, scale=scale).backward(grad_out),
        "eager_ms": lambda: eager_attention(q, k, v, scale).backward(grad_out),
        "sdpa_ms": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).backward(grad_out),
    }
    if use_compile:
        compiled = torch.compile(eager_attention, dynamic=False)
        candidates["compile_ms"] = lambda: compiled(q, k, v, scale).backward(grad_out)
    measurements = Measurements(device)
    times = {key: measurements.time(key, fn, grad_to_none=(q, k, v)) for key, fn in candidates.items()}
    return make_row((batch, heads, length, length), "bfloat16", "causal", "fwd+bwd", times, None, copy_per_ms,
                    info, case="attention", error=measurements.error())


def per_call_ms(fn, device):
    fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(HOST_OVERHEAD_CALLS):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / HOST_OVERHEAD_CALLS


def bench_host_overhead(device, copy_per_ms, info):
    """Time per call on a tiny tensor, where the launch and the Python around it are all there is."""
    x = torch.randn(1, 1, 4, 4, device=device)
    times = {"ours_ms": per_call_ms(lambda: scaled_mask_softmax(x), device),
             "softmax_ms": per_call_ms(lambda: torch.softmax(x, -1), device)}
    return make_row(x.shape, "float32", "none", "fwd", times, None, copy_per_ms, info, case="host_overhead")


def write_json(rows, path):
    with open(path, "w") as file:
        json.dump(rows, file, indent=1)


def write_csv(rows, path):
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "shape": "x".join(map(str, row["shape"]))})


def plot(rows, path):
    """Per pass, bars of ours, torch.compile and eager over the floor for every cell; 1.0 is the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = [p for p in PASSES if any(r["case"] == "softmax" and r["pass"] == p for r in rows)]
    bars = (("ours_ms", "ours"), ("compile_ms", "torch.compile"), ("eager_ms", "eager"))
    widest = max(sum(r["case"] == "softmax" and r["pass"] == p for r in rows) for p in passes)
    figure, axes = plt.subplots(len(passes), 1, figsize=(max(8.0, 0.42 * widest), 4.2 * len(passes)),
                                squeeze=False)
    for axis, pass_name in zip(axes[:, 0], passes):
        pass_rows = [r for r in rows if r["case"] == "softmax" and r["pass"] == pass_name]
        width = 0.8 / len(bars)
        for index, (key, label) in enumerate(bars):
            heights = [ratio(r[key], r["floor_ms"]) or math.nan for r in pass_rows]
            positions = [cell + (index - 1) * width for cell in range(len(pass_rows))]
            axis.bar(positions, heights, width, label=label)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(pass_rows)))
        axis.set_xticklabels([f"{'x'.join(map(str, r['shape']))}\n{r['dtype']} {r['variant']}" for r in pass_rows],
                             rotation=90, fontsize=7)
        axis.set_ylabel("time / byte floor")
        axis.set_title(f"{pass_name}: {rows[0]['gpu']}, torch {rows[0]['torch']}, "
                       f"scaled_mask_softmax {rows[0]['version']}, {rows[0]['date'][:10]}")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def comma_list(choices):
    def parse(text):
        items = tuple(text.split(","))
        unknown = [item for item in items if item not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"expected some of {', '.join(choices)}; got {', '.join(unknown)}")
        return items
    return parse


class Progress:
    """Progress on stderr: a tqdm bar on a terminal where tqdm is installed, otherwise a line per cell."""

    def __init__(self, total):
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, file=sys.stderr, unit="cell")
            except ImportError:
                pass
        self.total = total
        self.done = 0

    def start(self, label):
        if self.bar:
            self.bar.set_description(label)
        else:
            print(f"[{self.done + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def print(self, line):
        if self.bar:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def advance(self):
        self.done += 1
        if self.bar:
            self.bar.update()

    def close(self):
        if self.bar:
            self.bar.close()


def parse_arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m scaled_mask_softmax bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    parser.add_argument("--grid", type=parse_grid, help=f"{', '.join(GRIDS)} or shapes like 8x32x1024x1024,... "
                        "(default: 'default' on CUDA, 'cpu' on the CPU)")
    parser.add_argument("--dtypes", type=comma_list(DTYPES), help=f"some of {','.join(DTYPES)}")
    parser.add_argument("--variants", type=comma_list(tuple(ALL_VARIANTS)), default=tuple(VARIANTS),
                        help=f"some of {','.join(ALL_VARIANTS)} (default: {','.join(VARIANTS)})")
    parser.add_argument("--passes", type=comma_list(PASSES), default=PASSES, help=f"some of {','.join(PASSES)}")
    parser.add_argument("--no-compile", dest="use_compile", action="store_false",
                        help="skip torch.compile, which spends seconds compiling every cell")
    parser.add_argument("--e2e", action="store_true",
                        help="also causal attention forward+backward and the host overhead per call")
    parser.add_argument("--json", help="write the rows to this JSON file")
    parser.add_argument("--csv", help="write the rows to this CSV file")
    parser.add_argument("--plot", help="draw time over floor per cell into this PNG (needs matplotlib)")
    return parser.parse_args(argv)


def main(argv) -> int:
    args = parse_arguments(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda was asked for, but torch sees no CUDA device")
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("bench: --plot needs matplotlib (pip install matplotlib)")
        return 2
    todo = list(cells(args.grid or GRIDS["default" if device.type == "cuda" else "cpu"], args.dtypes, args.variants))
    if not todo:
        print("bench: no cell of the grid matches --dtypes and --variants")
        return 2
    info = metadata(device)
    print(f"{info['gpu']}, torch {info['torch']}, scaled_mask_softmax {info['version']}, {info['date']}")
    if device.type == "cpu":
        print("No CUDA device: this measures the CPU path (medians of time.perf_counter), not the GPU kernels.")
    copy_per_ms = copy_bytes_per_ms(device)
    print(f"copy ceiling: {copy_per_ms / 1e6:.0f} GB/s (bytes read + written); scale {SCALE}; times in ms")
    for variant in args.variants:
        print(f"  {variant}: {ALL_VARIANTS[variant]}")

    rows = []
    progress = Progress(len(todo))
    progress.print(TABLE_HEADER)
    for shape, dtype_name, variant in todo:
        if device.type == "cuda":
            shape = fit_shape(shape, getattr(torch, dtype_name).itemsize, torch.cuda.mem_get_info(device)[0])
        progress.start(f"{'x'.join(map(str, shape))} {dtype_name} {variant}")
        for row in bench_cell(shape, dtype_name, variant, args.passes, device, copy_per_ms, info, args.use_compile):
            rows.append(row)
            progress.print(format_row(row))
        release(device)
        progress.advance()
    progress.close()

    if args.e2e:
        attention_row = bench_attention(device, copy_per_ms, info, args.use_compile)
        release(device)
        overhead_row = bench_host_overhead(device, copy_per_ms, info)
        rows += [attention_row, overhead_row]
        print(f"\ncausal attention fwd+bwd, B x H x S x head dim = {'x'.join(map(str, E2E_SHAPE[device.type]))}, "
              "bf16 (ms): " + ", ".join(f"{key.removesuffix('_ms')} {format_ms(attention_row[key]).strip()}"
                                        for key in ("ours_ms", "compile_ms", "eager_ms", "sdpa_ms"))
              + (f"  [{attention_row['error']}]" if attention_row["error"] else ""))
        print(f"host overhead per call on a [1,1,4,4] tensor (us): ours {overhead_row['ours_ms'] * 1e3:.1f}, "
              f"torch.softmax {overhead_row['softmax_ms'] * 1e3:.1f}")

    if args.json:
        write_json(rows, args.json)
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, args.plot)
    failed = [row for row in rows if row["error"]]
    if failed:
        print(f"{len(failed)} rows recorded errors")
    return 1 if failed else 0
