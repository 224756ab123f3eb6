"""Forward+backward with a learnable head bias: 16-bit x and an fp32 bias [1, H, Sq, Sk] that requires grad, against
the same call with a bias that needs no gradient, and the eager composite and torch.compile's of it, over the byte
floor (each operand read once and each result written once: x, bias, y; y, dy, dx and the bias's gradient; under
--causal, the operands read only where a query sees its key, upper-left, as a decoder's relative position bias).

    python benchmarks/learnable_bias.py [--shape 8x32x1024x1024] [--dtype bfloat16] [--causal] [--device cuda]
        [--kernels]

--kernels adds the GPU's busy time per step (bench.kernel_ms), for small shapes whose wall time the launches set.
"""
import argparse

import torch

from scaled_mask_softmax import bench, scaled_mask_softmax

SCALE = 0.125


def composite(x, bias, hidden=None):
    scores = x * SCALE + bias
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, -1).to(x.dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=lambda text: tuple(map(int, text.split("x"))), default=(8, 32, 1024, 1024))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--causal", action="store_true", help="query i sees keys j <= i (upper-left)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernels", action="store_true", help="also the GPU's busy time per step")
    args = parser.parse_args()
    if args.kernels and not args.device.startswith("cuda"):
        parser.error("--kernels: needs a CUDA --device")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.shape, generator=generator).to(device, dtype).requires_grad_()
    bias = torch.randn((1, *args.shape[1:]), generator=generator).to(device).requires_grad_()
    frozen_bias = bias.detach()
    dy = torch.randn(args.shape, generator=generator).to(device, dtype)
    compiled = torch.compile(composite)
    copy_per_ms = bench.copy_bytes_per_ms(device)

    rows, cols = args.shape[-2:]
    hidden = torch.ones(rows, cols, device=device, dtype=torch.bool).triu_(1) if args.causal else None

    def ours(x, bias):
        return scaled_mask_softmax(x, bias, SCALE, is_causal=args.causal)

    def step(function, mask):
        return lambda: function(x, mask).backward(dy)

    def peer_step(function):
        return lambda: function(x, bias, hidden).backward(dy)

    # Read: x, y and dy, and the bias, where visible; written whole: y, dx and the bias's gradient.
    visible = bench.visible_elements(args.shape, args.causal) / x.numel()
    x_bytes = x.numel() * x.element_size()
    bias_bytes = bias.numel() * bias.element_size()
    frozen_bytes = (3 * visible + 2) * x_bytes + visible * bias_bytes
    floors = {"learnable": (frozen_bytes + bias_bytes) / copy_per_ms, "frozen": frozen_bytes / copy_per_ms}
    cases = [("ours, learnable bias", step(ours, bias), "learnable"),
             ("ours, frozen bias", step(ours, frozen_bias), "frozen"),
             ("eager composite, learnable bias", peer_step(composite), "learnable"),
             ("torch.compile, learnable bias", peer_step(compiled), "learnable")]
    print(f"{'x'.join(map(str, args.shape))} {args.dtype}{', causal' if args.causal else ''}, fp32 bias "
          f"{list(bias.shape)}, copy {copy_per_ms / 1e6:.0f} GB/s; forward+backward")
    for name, fn, floor in cases:
        ms = bench.median_ms(fn, device, grad_to_none=(x, bias))
        kernels = f"  kernels {bench.kernel_ms(fn, device, (x, bias)):.3f} ms" if args.kernels else ""
        print(f"{name:34} {ms:8.3f} ms  {ms / floors[floor]:5.2f}x its floor ({floors[floor]:.3f} ms){kernels}")


if __name__ == "__main__":
    main()
