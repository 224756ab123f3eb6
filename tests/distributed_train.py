"""A tiny causal Transformer whose attention is the fused operator, trained for a few steps with
DistributedDataParallel, each rank on its share of every global batch:

    torchrun --standalone --nproc_per_node=2 tests/distributed_train.py --device cpu --out ddp

Each rank saves its losses (one per step, on its shard) and its final parameters to `ddp/rank<N>.pt`.
test_distributed.py averages the ranks' losses into the loss of the global batch, runs `train` on the whole global
batch in one process, and compares.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import scaled_mask_softmax as sms

VOCAB, WIDTH, HEADS, LAYERS, LENGTH = 32, 32, 4, 2, 16
GLOBAL_BATCH, STEPS, LEARNING_RATE = 8, 5, 0.5


class Block(torch.nn.Module):
    """Pre-norm causal self-attention through `sms.attention`, then an MLP."""

    def __init__(self):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.attention_out = torch.nn.Linear(WIDTH, WIDTH)
        self.mlp_norm = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, hidden):
        batch, length, _ = hidden.shape
        qkv = self.qkv(self.attention_norm(hidden)).view(batch, length, 3, HEADS, WIDTH // HEADS)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = sms.attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, length, WIDTH)
        hidden = hidden + self.attention_out(attended)
        return hidden + self.mlp(self.mlp_norm(hidden))


class TinyTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.position_embedding = torch.nn.Embedding(LENGTH, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(self.norm(hidden))


def build_model(device):
    """The same initial weights in every process."""
    torch.manual_seed(0)
    return TinyTransformer().to(device)


def global_batches():
    """`[STEPS, GLOBAL_BATCH, LENGTH + 1]` tokens, the same in every process: each sequence counts up (mod VOCAB)
    from a random start, so the next token is learnable within a few steps."""
    generator = torch.Generator().manual_seed(1)
    starts = torch.randint(VOCAB, (STEPS, GLOBAL_BATCH, 1), generator=generator)
    return (starts + torch.arange(LENGTH + 1)) % VOCAB


def train(model, batches):
    """One SGD step per batch on the next-token loss; returns the losses, one per step."""
    losses = []
    for tokens in batches:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        # SGD by hand: torch.optim imports torch._dynamo, which takes seconds per process on two cores.
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= LEARNING_RATE * parameter.grad
                parameter.grad = None
        losses.append(loss.detach())
    return torch.stack(losses)


def main():
    parser = argparse.ArgumentParser(description="Train the tiny Transformer with DDP (run under torchrun).")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", required=True, help="the folder where each rank saves its losses and parameters")
    args = parser.parse_args()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        # NVLink multicast (NVLS) buys a tiny model nothing, and some shared multi-GPU hosts forbid it.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        model = torch.nn.parallel.DistributedDataParallel(
            build_model(device), device_ids=None if device.type == "cpu" else [device])
        # DDP averages the gradients of equal shards: the gradient of the global batch's mean loss.
        shard = global_batches().chunk(world_size, dim=1)[rank].to(device)
        # No collective of our own: a gloo worker that frees a Python tensor while the interpreter shuts down
        # aborts the process (the exit below).
        losses = train(model, shard)
        parameters = {name: parameter.detach().cpu() for name, parameter in model.module.named_parameters()}
        torch.save({"losses": losses.cpu(), "parameters": parameters}, os.path.join(args.out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    # gloo's threads outlive destroy_process_group (still running after it, the DDP model deleted and collected),
    # and their teardown as the interpreter exits can abort a rank whose work is saved (about one run in fifty on
    # two cores): leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
