"""Lists the kernels that spill to local memory, from a build log made with SCALED_MASK_SOFTMAX_PTXAS_VERBOSE=1.

    python scripts/spill_report.py .venv/build.log [--strict]

With --strict the exit status is 1 when any kernel spills or keeps a stack frame (or the log holds no resource
report at all). Kernels that keep a stack frame without spilling are listed apart: an array the compiler could not
keep in registers (indexed at run time), read and written through local memory on every use. One such frame, 64
bytes, took the learnable bias's forward+backward at 197 columns to twice its time (benchmarks/NOTES.md, v111).
"""
import argparse
import re
import subprocess
import sys

PROPERTIES = re.compile(r"Function properties for (\S+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads")


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        return out.splitlines()
    except OSError:
        return names


def spilling_kernels(log_text):
    """{kernel: (stack frame, spill stores, spill loads)} for every kernel that spills, one entry per name."""
    found = {}
    for name, frame, stores, loads in PROPERTIES.findall(log_text):
        if int(stores) or int(loads):
            found[name] = (int(frame), int(stores), int(loads))
    return found


def kernels_with_a_frame(log_text):
    """{kernel: stack frame bytes} for every kernel that keeps a stack frame but spills nothing."""
    return {name: int(frame) for name, frame, stores, loads in PROPERTIES.findall(log_text)
            if int(frame) and not int(stores) and not int(loads)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any kernel spills or keeps a stack frame")
    args = parser.parse_args(argv)
    text = open(args.log, errors="replace").read()
    reported = len(PROPERTIES.findall(text))
    spills = spilling_kernels(text)
    frames = kernels_with_a_frame(text)
    print(f"ptxas resource report: {reported} kernel entries, {len(spills)} kernels spill, "
          f"{len(frames)} more keep a stack frame")
    for readable, (frame, stores, loads) in sorted(zip(demangle(list(spills)), spills.values())):
        print(f"  {stores:4d} B stored, {loads:4d} B loaded, {frame:4d} B frame  {readable}")
    for readable, frame in sorted(zip(demangle(list(frames)), frames.values())):
        print(f"  {frame:4d} B frame, no spill  {readable}")
    if args.strict and (spills or frames or not reported):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
