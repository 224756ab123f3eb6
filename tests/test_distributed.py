"""DistributedDataParallel in two processes (gloo on the CPU, nccl on two GPUs) training a small Transformer
built on the operator, against one process on the whole global batch: with the ranks' gradients averaged, every
step's loss and the final parameters must agree."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distributed_train
from conftest import environment_importing_this_package

SCRIPT = Path(__file__).with_name("distributed_train.py")

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]),
]


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_matches_single_process(device, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
               "--device", device, "--out", str(tmp_path)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env=environment_importing_this_package())
    assert finished.returncode == 0, finished.stdout + finished.stderr
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]

    model = distributed_train.build_model(device)
    losses = distributed_train.train(model, distributed_train.global_batches().to(device)).cpu()

    # fp32 sums split over two ranks round differently from one process's: a few ulps per step.
    ddp_losses = (ranks[0]["losses"] + ranks[1]["losses"]) / 2
    torch.testing.assert_close(ddp_losses, losses, atol=1e-5, rtol=1e-5)
    parameters = {name: parameter.detach().cpu() for name, parameter in model.named_parameters()}
    for rank in ranks:
        torch.testing.assert_close(rank["parameters"], parameters, atol=1e-5, rtol=1e-4)
    assert losses[-1] < losses[0], f"the loss did not go down: {losses.tolist()}"
