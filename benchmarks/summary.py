"""The README's performance table and the figures it quotes, from the rows of a benchmark run.

    python benchmarks/summary.py benchmarks/results/h200.json

Prints the markdown table (time over the floor of ours, torch.compile and eager, per cell and pass), then the
geometric-mean speedup over torch.compile, how many forward and backward cells are within 1.10 of the floor and how
many at least as fast as torch.compile, and the cells above 1.10, worst first.
"""
import json
import math
import sys

TABLE_HEADER = ("| B×H×Sq×Sk | dtype | mask | fwd ours | fwd compile | fwd eager | bwd ours | bwd compile "
                "| fwd+bwd ours | fwd+bwd compile |\n|---|---|---|---|---|---|---|---|---|---|")
TARGET = 1.10


def grid_rows(rows):
    """The rows of the grid's cells that ran: not the end-to-end or host-overhead rows, none with an error."""
    return [row for row in rows if row.get("case", "softmax") == "softmax" and not row["error"]]


def over_floor(row, key="ours_ms"):
    return row[key] / row["floor_ms"]


def markdown_table(rows):
    passes = {}
    for row in grid_rows(rows):
        passes.setdefault((tuple(row["shape"]), row["dtype"], row["variant"]), {})[row["pass"]] = row
    lines = [TABLE_HEADER]
    for (shape, dtype, variant), cell in passes.items():
        figures = [over_floor(cell["fwd"]), over_floor(cell["fwd"], "compile_ms"), over_floor(cell["fwd"], "eager_ms"),
                   over_floor(cell["bwd"]), over_floor(cell["bwd"], "compile_ms"),
                   over_floor(cell["fwd+bwd"]), over_floor(cell["fwd+bwd"], "compile_ms")]
        lines.append(f"| {'×'.join(map(str, shape))} | {dtype} | {variant} | "
                     + " | ".join(f"{figure:.2f}" for figure in figures) + " |")
    return "\n".join(lines)


def geometric_mean_speedup(rows):
    return math.exp(sum(math.log(row["compile_ms"] / row["ours_ms"]) for row in rows) / len(rows))


def figures(rows):
    """The lines of the summary under the table."""
    rows = grid_rows(rows)
    single = [row for row in rows if row["pass"] in ("fwd", "bwd")]
    behind = [row for row in single if row["compile_ms"] < row["ours_ms"]]
    over = sorted((row for row in single if over_floor(row) > TARGET), key=over_floor, reverse=True)
    lines = [f"copy ceiling {rows[0]['copy_GBps']:.0f} GB/s",
             f"geometric-mean speedup over torch.compile: {geometric_mean_speedup(single):.3f} over {len(single)} "
             f"forward and backward cells, {geometric_mean_speedup(rows):.3f} with forward+backward",
             f"within {TARGET:.2f} of the floor: {len(single) - len(over)} of {len(single)}",
             f"at least as fast as torch.compile: {len(single) - len(behind)} of {len(single)}"]
    if behind:
        lines.append(f"  the others at {min(r['compile_ms'] / r['ours_ms'] for r in behind):.3f}"
                     f"-{max(r['compile_ms'] / r['ours_ms'] for r in behind):.3f} of its speed, where it takes at most "
                     f"{max(over_floor(r, 'compile_ms') for r in behind):.3f} of the floor")
    lines.append(f"above {TARGET:.2f} of the floor, worst first:")
    lines += [f"  {'x'.join(map(str, row['shape']))} {row['dtype']} {row['variant']} {row['pass']} "
              f"{over_floor(row):.3f}" for row in over]
    return lines


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip())
        return 2
    with open(argv[0]) as results:
        rows = json.load(results)
    print(markdown_table(rows))
    print()
    print("\n".join(figures(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
