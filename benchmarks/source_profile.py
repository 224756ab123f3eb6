"""Where a kernel's warps spend their time, instruction by instruction, from Nsight Compute's source page:

    ncu --set full --import-source no -o report ...        (scripts/profile.sh with SOURCE=1 does this)
    ncu -i report.ncu-rep --page source --csv --print-source sass | gzip > source.csv.gz
    python benchmarks/source_profile.py source.csv.gz [--kernel 0] [--top 30]

For each kernel launch in the file (or the one --kernel picks, by its place): the warp instructions executed, the
warp-stall samples and their reasons, the opcodes by instructions executed and by samples, and the instructions
that hold the most samples, each with its line in the listing, how often it ran and its main stall reasons.
"""
import argparse
import collections
import csv
import gzip
import re
import sys

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"
STALL_PREFIX = "stall_"


def read_kernels(lines):
    """[(kernel name, [row dicts])] from the CSV's lines: a "Kernel Name" row, a header row, then one row each."""
    kernels, header = [], None
    for row in csv.reader(lines):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append((row[1], []))
            header = None
        elif header is None:
            header = row
        else:
            kernels[-1][1].append(dict(zip(header, row)))
    return kernels


def number(row, column):
    value = row.get(column, "")
    return float(value) if value not in ("", "-") else 0.0


def opcode(source):
    """The opcode of a SASS line without its guard predicate or modifiers: "@!P1 LDS.128 R8, [R9]" -> "LDS"."""
    match = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", source)
    return match.group(1) if match else source.strip()


def stall_columns(rows):
    """{reason: its column} for the stall reasons of all samples (not the not-issued ones)."""
    columns = rows[0] if rows else {}
    return {c[len(STALL_PREFIX):]: c for c in columns if c.startswith(STALL_PREFIX) and "Not Issued" not in c}


def shares(counter, total, count):
    return ", ".join(f"{key} {100 * value / total:.1f}%" for key, value in counter.most_common(count) if value)


def summarize(name, rows, top):
    stalls = stall_columns(rows)
    by_reason = collections.Counter({reason: sum(number(r, c) for r in rows) for reason, c in stalls.items()})
    by_opcode_executed, by_opcode_samples = collections.Counter(), collections.Counter()
    for row in rows:
        op = opcode(row["Source"])
        by_opcode_executed[op] += number(row, EXECUTED)
        by_opcode_samples[op] += number(row, SAMPLES)
    executed = sum(by_opcode_executed.values())
    samples = sum(by_opcode_samples.values())
    shares_of = samples or 1.0  # a launch with no samples shows none, not a division by zero
    lines = [name,
             f"  warp instructions executed {executed / 1e6:.1f} M, warp-stall samples {samples:.0f}",
             f"  stalls: {shares(by_reason, shares_of, len(by_reason))}",
             f"  opcodes by instructions: {shares(by_opcode_executed, executed or 1.0, 20)}",
             f"  opcodes by samples: {shares(by_opcode_samples, shares_of, 12)}",
             "  line  samples  executed  instruction  (main stall reasons)"]
    hottest = sorted(range(len(rows)), key=lambda i: -number(rows[i], SAMPLES))[:top]
    for i in hottest:
        row = rows[i]
        reasons = sorted(((number(row, c), reason) for reason, c in stalls.items()), reverse=True)[:3]
        reasons_text = " ".join(f"{reason} {value:.0f}" for value, reason in reasons if value)
        lines.append(f"  {i:5d} {100 * number(row, SAMPLES) / shares_of:6.2f}% {number(row, EXECUTED):9.0f}  "
                     f"{row['Source'].strip()[:56]:56s} ({reasons_text})")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv output, plain or gzipped")
    parser.add_argument("--kernel", type=int, help="only the launch at this place in the file (from 0)")
    parser.add_argument("--top", type=int, default=30, help="instructions to list, by samples")
    args = parser.parse_args(argv)
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt", newline="") as lines:
        kernels = read_kernels(lines)
    if args.kernel is not None:
        if not 0 <= args.kernel < len(kernels):
            parser.error(f"--kernel must be below {len(kernels)}, the launches in {args.csv}; got {args.kernel}")
        kernels = [kernels[args.kernel]]
    print("\n\n".join(summarize(name, rows, args.top) for name, rows in kernels))


if __name__ == "__main__":
    sys.exit(main())
