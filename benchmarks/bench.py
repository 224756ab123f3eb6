"""Runs `python -m scaled_mask_softmax bench` and keeps its rows and plot in benchmarks/results/<device>.json and
.png (h200.json on an H200). Options pass through: `python benchmarks/bench.py --grid quick --e2e`."""
import argparse
import sys
from pathlib import Path

import torch

from scaled_mask_softmax import bench

RESULTS = Path(__file__).parent / "results"


def main(argv) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--device")
    requested = parser.parse_known_args(argv)[0].device
    device = torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu"))
    stem = RESULTS / bench.device_slug(bench.metadata(device)["gpu"])
    RESULTS.mkdir(exist_ok=True)
    # Options given on the command line come later and override these paths.
    return bench.main(["--json", f"{stem}.json", "--plot", f"{stem}.png", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
