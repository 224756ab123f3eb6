"""python -m scaled_mask_softmax check | bench | doctor"""
import importlib
import sys

COMMANDS = {
    "check": "the correctness matrix against the float64 reference, on every available device",
    "bench": "time the operator against eager PyTorch, torch.softmax and torch.compile, with the byte floor",
    "doctor": "diagnose the toolkit, the build and the GPU, with the fix for each problem found",
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m scaled_mask_softmax {check,bench,doctor} [options]\n")
        for name, purpose in COMMANDS.items():
            print(f"  {name:7} {purpose}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command = importlib.import_module(f"scaled_mask_softmax.{argv[0]}")
    return command.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
