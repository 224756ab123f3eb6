"""Memory: autograd keeps only y, repeated calls leave nothing behind, and forward+backward peaks no higher
than the eager composite."""
import gc
import math
import os
import resource
import tracemalloc

import pytest
import torch

import scaled_mask_softmax as sms
from scaled_mask_softmax.reference import eager_composite
from conftest import DEVICES, random_scores

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make_mask(kind, shape, device):
    """None, a bool key mask, or a learnable additive bias over the last two dims."""
    if kind == "none":
        return None
    if kind == "bool":
        mask = torch.ones(shape[-1], dtype=torch.bool)
        mask[-3:] = False
        return mask.to(device)
    return random_scores(shape[-2:], torch.float32, device, generator_seed=4).requires_grad_()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "learnable_bias"])
def test_forward_saves_only_y(device, mask_kind):
    x = random_scores((2, 3, 8, 40), torch.float32, device).requires_grad_()
    mask = make_mask(mask_kind, x.shape, device)
    saved = []

    def record(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(record, lambda tensor: tensor):
        y = sms.scaled_mask_softmax(x, mask, 0.5, is_causal=True)
    assert len(saved) == 1
    assert saved[0].data_ptr() == y.data_ptr() and torch.equal(saved[0], y)


def forward_backward(x, mask, dy):
    y = sms.scaled_mask_softmax(x, mask, 0.5, is_causal=True)
    inputs = [x] if mask is None or not mask.requires_grad else [x, mask]
    torch.autograd.grad(y, inputs, dy)


def repeated_call_inputs(device, dtype, mask_kind):
    """x, the mask and dy of the many-calls tests: small, so that only a leak could add up."""
    x = random_scores((2, 4, 16, 64), dtype, device).requires_grad_()
    dy = random_scores(x.shape, dtype, device, generator_seed=1)
    return x, make_mask(mask_kind, x.shape, device), dy


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
@pytest.mark.parametrize("mask_kind", ["none", "learnable_bias"])
def test_no_growth_over_many_calls_cpu(mask_kind):
    # 32 KiB per tensor: a leaked y or gradient per call would add about 100 MiB over the calls below.
    x, mask, dy = repeated_call_inputs("cpu", torch.float32, mask_kind)
    # The warm-up lets one-time state (dispatcher caches, allocator arenas) settle before measuring.
    for _ in range(200):
        forward_backward(x, mask, dy)
    gc.collect()
    tracemalloc.start()
    try:
        python_before, rss_before = tracemalloc.get_traced_memory()[0], resident_bytes()
        for _ in range(3000):
            forward_backward(x, mask, dy)
        gc.collect()
        python_growth = tracemalloc.get_traced_memory()[0] - python_before
        rss_growth = resident_bytes() - rss_before
    finally:
        tracemalloc.stop()
    # A leaked autograd node or ctx per call would be hundreds of KiB of Python objects.
    assert python_growth < 64 * 1024, f"Python-level memory grew by {python_growth} bytes"
    assert rss_growth < 16 * 2**20, f"resident memory grew by {rss_growth} bytes"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mask_kind", ["none", "learnable_bias"])
def test_no_growth_over_10000_calls_cuda(mask_kind):
    x, mask, dy = repeated_call_inputs("cuda", torch.bfloat16, mask_kind)
    for _ in range(10):
        forward_backward(x, mask, dy)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(10_000):
        forward_backward(x, mask, dy)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def bytes_allocated_during(call, device):
    """What `call` allocates: at its peak on CUDA, in all on the CPU (as torch's profiler records it)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        call()
    return sum(max(event.self_cpu_memory_usage, 0) for event in profile.events())


def peak_forward_backward_bytes(softmax, x, dy):
    """Peak CUDA memory of `softmax(x)` and its backward, above what was allocated before."""
    x = x.detach().requires_grad_()
    return bytes_allocated_during(lambda: softmax(x).backward(dy), "cuda")


@pytest.mark.gpu
@needs_cuda
def test_peak_memory_not_above_eager_composite(record_property):
    shape, scale = (4, 8, 512, 512), 512 ** -0.5
    x = random_scores(shape, torch.bfloat16, "cuda")
    dy = random_scores(shape, torch.bfloat16, "cuda", generator_seed=1)
    padding = torch.zeros(shape[0], 1, 1, shape[-1], dtype=torch.bfloat16)
    padding[1:, ..., 400:] = float("-inf")
    padding = padding.to("cuda")
    softmaxes = {
        "ours": lambda x: sms.scaled_mask_softmax(x, padding, scale, is_causal=True),
        "eager": lambda x: eager_composite(x, padding, scale, is_causal=True),
    }
    peaks = {}
    for name, softmax in softmaxes.items():
        peak_forward_backward_bytes(softmax, x, dy)  # warm-up: one-time workspaces stay out of the measurement
        peaks[name] = peak_forward_backward_bytes(softmax, x, dy)
        record_property(f"peak_bytes_{name}", peaks[name])
    print(f"\npeak memory of forward+backward, {list(shape)} bfloat16, key padding and causal: "
          f"ours {peaks['ours'] / 2**20:.1f} MiB, eager composite {peaks['eager'] / 2**20:.1f} MiB")
    assert peaks["ours"] <= peaks["eager"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_dtype, mask_shape", [(torch.float64, (64, 256)), (torch.float16, (1, 8, 64, 256)),
                                                    (torch.bfloat16, (4, 1, 64, 1))])
def test_expanded_masks_are_not_written_out(device, mask_dtype, mask_shape):
    """A mask passed as an expanded view of x's shape is converted to the compute type (fp64 and fp16 under bf16
    x), or its rows made contiguous (a last dim of 1, expanded over the keys), at its own size: y and the mask's own
    elements, each along the keys in fp32 at most, are all the call allocates."""
    shape = (4, 8, 64, 256)
    x = random_scores(shape, torch.bfloat16, device)
    mask = random_scores(mask_shape, mask_dtype, device, generator_seed=4).expand(shape)
    sms.scaled_mask_softmax(x, mask)  # warm-up: one-time state stays out of the measurement
    allocated = bytes_allocated_during(lambda: sms.scaled_mask_softmax(x, mask), device)
    y_bytes = x.numel() * x.element_size()
    assert allocated <= y_bytes + math.prod(mask_shape[:-1]) * shape[-1] * 4
