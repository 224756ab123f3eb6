"""The README's performance table and the figures it quotes, from the rows of a benchmark run.

    python benchmarks/summary.py benchmarks/results/h200.json

Prints the markdown table (time over the floor of ours, torch.compile and eager, per cell and pass), then the
geometric-mean speedup over torch.compile, how many forward and backward cells are within 1.10 of the floor and how
many at least as fast as torch.compile, and the cells above 1.10, worst first; then the bf16 forwards that the
peers' figures are quoted at, in copies of x, the end-to-end attention and the host cost of a call.
"""
import json
import math
import sys

TABLE_HEADER = ("| B×H×Sq×Sk | dtype | mask | fwd ours | fwd compile | fwd eager | bwd ours | bwd compile "
                "| fwd+bwd ours | fwd+bwd compile |\n|---|---|---|---|---|---|---|---|---|---|")
TARGET = 1.10
# The bf16 forwards at which the README quotes the peers, in units of one copy of x.
QUOTED_FORWARDS = (((2, 16, 4096, 4096), "none"), ((1, 4, 16384, 16384), "none"), ((2, 16, 4096, 4096), "causal"),
                   ((1, 4, 16384, 16384), "causal"), ((8, 32, 1024, 1024), "key_padding"))


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


def sees_a_quarter_at_most(row):
    """Causal (upper-left) rows that see at most a quarter of their keys: ours reads only those, the peers all."""
    queries, keys = row["shape"][-2:]
    return row["variant"] == "causal" and 4 * queries <= keys


def compile_capped(row, passes):
    """A forward+backward row with torch.compile's time at most its forward's plus its backward's: where its calls'
    host time exceeds their GPU time (short rows), timing the two passes as one counts that host time too."""
    forward, backward = (passes[tuple(row["shape"]), row["dtype"], row["variant"], name] for name in ("fwd", "bwd"))
    return dict(row, compile_ms=min(row["compile_ms"], forward["compile_ms"] + backward["compile_ms"]))


def figures(rows):
    """The lines of the summary under the table."""
    rows = grid_rows(rows)
    single = [row for row in rows if row["pass"] in ("fwd", "bwd")]
    both = [row for row in rows if row["pass"] == "fwd+bwd"]
    passes = {(tuple(row["shape"]), row["dtype"], row["variant"], row["pass"]): row for row in rows}
    behind = [row for row in single if row["compile_ms"] < row["ours_ms"]]
    over = sorted((row for row in single if over_floor(row) > TARGET), key=over_floor, reverse=True)
    usual = [row for row in single if not sees_a_quarter_at_most(row)]
    lines = [f"copy ceiling {rows[0]['copy_GBps']:.0f} GB/s",
             f"geometric-mean speedup over torch.compile: {geometric_mean_speedup(single):.3f} over {len(single)} "
             f"forward and backward cells, {geometric_mean_speedup(usual):.3f} over the {len(usual)} whose causal rows "
             "see more than a quarter of their keys",
             f"  over the {len(both)} forward+backward cells: {geometric_mean_speedup(both):.3f}, "
             f"{geometric_mean_speedup([compile_capped(row, passes) for row in both]):.3f} with torch.compile's "
             "time at most its forward's plus its backward's",
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


def copies_of_x(row, key):
    """row[key] over the time to read and write x (2 bytes an element) once at the run's copy bandwidth."""
    copy_ms = 2 * 2 * math.prod(row["shape"]) / (row["copy_GBps"] * 1e6)
    return row[key] / copy_ms


def quoted_figures(rows):
    """The lines for the README's figures beside the table: copies of x, end to end, host cost."""
    forwards = {(tuple(row["shape"]), row["variant"]): row for row in grid_rows(rows)
                if row["pass"] == "fwd" and row["dtype"] == "bfloat16"}
    lines = ["bf16 forward in copies of x, ours / torch.compile:"]
    lines += [f"  {'x'.join(map(str, shape))} {variant}: {copies_of_x(forwards[shape, variant], 'ours_ms'):.2f} / "
              f"{copies_of_x(forwards[shape, variant], 'compile_ms'):.2f}"
              for shape, variant in QUOTED_FORWARDS if (shape, variant) in forwards]
    for row in rows:
        if row.get("case") == "attention" and not row["error"]:
            lines.append(f"attention {'x'.join(map(str, row['shape']))} {row['dtype']} {row['variant']} "
                         f"{row['pass']}: ours {row['ours_ms']:.2f} ms, eager {row['eager_ms']:.2f} "
                         f"({row['eager_ms'] / row['ours_ms']:.1f}x ours), torch.compile {row['compile_ms']:.2f}, "
                         f"SDPA {row['sdpa_ms']:.2f}")
        elif row.get("case") == "host_overhead" and not row["error"]:
            lines.append(f"host cost of a call on {row['shape']}: ours {row['ours_ms'] * 1e3:.1f} us, "
                         f"torch.softmax {row['softmax_ms'] * 1e3:.1f} us")
    return lines


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip())
        return 2
    with open(argv[0]) as results:
        rows = json.load(results)
    print(markdown_table(rows))
    print()
    print("\n".join(figures(rows) + quoted_figures(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
