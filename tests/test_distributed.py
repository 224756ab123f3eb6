"""DistributedDataParallel in two processes (gloo on the CPU, nccl on two GPUs) training a small Transformer
built on the operator, against one process on the whole global batch: with the ranks' gradients averaged, every
step's loss and the final parameters must agree."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distributed_train

SCRIPT = Path(__file__).with_name("distributed_train.py")

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]),
]


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_matches_single_process(device, tmp_path):
    out = tmp_path / "ddp.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
               "--device", device, "--out", str(out)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    ddp = torch.load(out)

    model = distributed_train.build_model(device)
    losses = distributed_train.train(model, distributed_train.global_batches().to(device)).cpu()

    # fp32 sums split over two ranks round differently from one process's: a few ulps per step.
    torch.testing.assert_close(ddp["losses"], losses, atol=1e-5, rtol=1e-5)
    parameters = {name: parameter.detach().cpu() for name, parameter in model.named_parameters()}
    torch.testing.assert_close(ddp["parameters"], parameters, atol=1e-5, rtol=1e-4)
    assert losses[-1] < losses[0], f"the loss did not go down: {losses.tolist()}"
