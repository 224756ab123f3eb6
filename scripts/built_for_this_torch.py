"""Exits 1, saying why, where the libraries that a build record (_build_info.json) describes were built against
another torch than this one: prebuilt libraries (scripts/variants.sh prebuild) load only under the torch they were
built against. Run without importing the package, whose libraries it checks.

    python3 scripts/built_for_this_torch.py scaled_mask_softmax/_build_info.json
"""
import json
import sys

import torch

with open(sys.argv[1]) as record:
    built = json.load(record)["torch_version"]
if built != torch.__version__:
    sys.exit(f"built against torch {built}, this is torch {torch.__version__}")
