"""The check and bench commands on the CPU, the byte floor, grid and row arithmetic behind bench, and the
benchmarks' own scripts (summary.py, plain.py, source_profile.py)."""
import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from scaled_mask_softmax import bench, check

ROOT = Path(__file__).resolve().parent.parent


def test_check_passes_on_cpu():
    assert check.main(["--device", "cpu", "--quick"]) == 0


def test_bench_writes_rows_on_cpu(tmp_path):
    json_path, csv_path = tmp_path / "rows.json", tmp_path / "rows.csv"
    # torch.compile is left out: compiling C++ for each cell takes tens of seconds on two cores.
    status = bench.main(["--device", "cpu", "--grid", "1x2x8x16", "--variants", "none,causal,key_padding",
                         "--no-compile", "--json", str(json_path), "--csv", str(csv_path)])
    assert status == 0
    rows = json.loads(json_path.read_text())
    assert len(rows) == 3 * len(bench.PASSES)
    expected = {"shape", "dtype", "variant", "pass", "ours_ms", "floor_ms", "compile_ms", "eager_ms", "softmax_ms",
                "copy_GBps", "ours_GBps", "ours_over_floor", "speedup_vs_compile", "speedup_vs_eager",
                "gpu", "torch", "version", "date"}
    for row in rows:
        assert expected <= row.keys()
        assert row["shape"] == [1, 2, 8, 16] and row["dtype"] == "bfloat16"
        assert row["floor_ms"] > 0 and row["ours_ms"] > 0 and row["eager_ms"] > 0
        assert row["compile_ms"] is None
        assert (row["softmax_ms"] is not None) == (row["variant"] == "none")
    with open(csv_path) as file:
        assert len(list(csv.DictReader(file))) == len(rows)


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [bench.make_row((1, 2, 8, 16), "bfloat16", variant, pass_name,
                           {"ours_ms": 2.0, "compile_ms": 3.0, "eager_ms": None}, 1000, 1000.0,
                           bench.metadata(torch.device("cpu")))
            for variant in ("none", "causal") for pass_name in bench.PASSES]
    bench.plot(rows, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_visible_elements_causal():
    # upper_left: query i sees min(Sk, i + 1) keys.
    assert bench.visible_elements((1, 1, 4, 4), True) == 1 + 2 + 3 + 4
    assert bench.visible_elements((2, 3, 4, 2), True) == 6 * (1 + 2 + 2 + 2)
    assert bench.visible_elements((1, 1, 2, 5), True) == 1 + 2
    assert bench.visible_elements((2, 3, 4, 5), False) == 120


def test_necessary_bytes_causal():
    shape, itemsize, visible, everything = (2, 3, 4, 4), 2, 6 * 10, 6 * 16
    assert bench.necessary_bytes("fwd", shape, itemsize, True) == (visible + everything) * itemsize
    assert bench.necessary_bytes("bwd", shape, itemsize, True) == (2 * visible + everything) * itemsize
    assert bench.necessary_bytes("fwd+bwd", shape, itemsize, True) == (3 * visible + 2 * everything) * itemsize
    # A full-shape mask under the causal mask is read only where visible.
    assert (bench.necessary_bytes("fwd", shape, itemsize, True, mask_shape=shape, mask_itemsize=2)
            == (2 * visible + everything) * itemsize)


def test_necessary_bytes_broadcast_mask():
    shape = (2, 3, 4, 8)
    everything = 2 * 3 * 4 * 8 * 2
    # A bool key padding mask [B, 1, 1, Sk] is read once per distinct element, one byte each.
    assert bench.necessary_bytes("fwd", shape, 2, False, (2, 1, 1, 8), 1) == 2 * everything + 2 * 8
    # A bias without the batch dim, given with fewer dims than x.
    assert bench.necessary_bytes("fwd", shape, 2, False, (3, 4, 8), 4) == 2 * everything + 3 * 4 * 8 * 4
    # Masks play no part in the backward.
    assert bench.necessary_bytes("bwd", shape, 2, False, (2, 1, 1, 8), 1) == 3 * everything


def test_parse_grid():
    assert bench.parse_grid("quick") is bench.GRIDS["quick"]
    assert bench.parse_grid("1x2x8x16,2x2x4x4") == (((1, 2, 8, 16), None), ((2, 2, 4, 4), None))
    with pytest.raises(Exception, match="8x32x1024x1024"):
        bench.parse_grid("1x2x8")


def test_cells_carry_every_dtype_only_where_the_grid_says():
    default = list(bench.cells(bench.GRIDS["default"]))
    assert len(default) == (7 + 2) * len(bench.VARIANTS)
    assert {shape for shape, dtype, _ in default if dtype == "float32"} == {(8, 32, 1024, 1024)}
    assert [cell[:2] for cell in bench.cells(bench.GRIDS["default"], ("float16",), ("none",))] == \
        [((8, 32, 1024, 1024), "float16")]
    assert list(bench.cells(bench.parse_grid("1x1x4x4"), ("float32",), ("bias",))) == \
        [((1, 1, 4, 4), "float32", "bias")]


def test_fit_shape_halves_batch_then_heads_never_the_row():
    shape = (4, 2, 8, 16)
    assert bench.fit_shape(shape, 2, 10**9) == shape
    need = bench.X_SIZED_TENSORS_AT_PEAK * 2
    assert bench.fit_shape(shape, 2, need * 2 * 2 * 8 * 16) == (2, 2, 8, 16)
    assert bench.fit_shape(shape, 2, need * 1 * 1 * 8 * 16) == (1, 1, 8, 16)
    assert bench.fit_shape(shape, 2, need * 16) == (1, 1, 1, 16)


def test_inputs_of_each_variant():
    generator = torch.Generator().manual_seed(0)
    shape = (2, 3, 8, 16)
    for variant in bench.ALL_VARIANTS:
        x, mask, peer_mask, is_causal = bench.make_inputs(shape, torch.bfloat16, variant, "cpu", generator)
        assert is_causal == variant.startswith("causal")
        # Random normal values, not zeros (torch 2.11's CPU randn rounds about 1% of bf16 draws to 0).
        assert (x != 0).float().mean() > 0.95 and x.float().std() > 0.5
        if mask is None:
            continue
        expected_shape, expected_dtype = {"additive": (shape, torch.bfloat16),
                                          "key_padding": ((2, 1, 1, 16), torch.bool),
                                          "bias": ((1, 3, 8, 16), torch.bfloat16)}[variant.removeprefix("causal_")]
        assert mask.shape == expected_shape and mask.dtype == expected_dtype
        # The eager composite adds its mask, so it always gets one in x's dtype.
        assert peer_mask.dtype == torch.bfloat16
        # No row is fully masked.
        assert (peer_mask.expand(shape) != float("-inf")).any(-1).all()


def test_row_ratios():
    info = bench.metadata(torch.device("cpu"))
    row = bench.make_row((1, 1, 4, 4), "float32", "none", "fwd", {"ours_ms": 2.0, "compile_ms": 3.0,
                         "eager_ms": 8.0}, floor_bytes=1e6, copy_per_ms=1e6, info=info)
    assert row["floor_ms"] == 1.0 and row["ours_over_floor"] == 2.0
    assert row["speedup_vs_compile"] == 1.5 and row["speedup_vs_eager"] == 4.0
    assert row["ours_GBps"] == pytest.approx(1e6 / 2.0 / 1e6) and row["copy_GBps"] == 1.0
    assert row["softmax_ms"] is None and row["error"] is None


def test_device_slug():
    assert bench.device_slug("NVIDIA H200") == "h200"
    assert bench.device_slug("NVIDIA H200 NVL") == "h200"
    assert bench.device_slug("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb"
    assert bench.device_slug("cpu (x86_64)") == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_ms_counts_each_launch_of_a_step_once():
    source = torch.randn(2**26, device="cuda")
    target = torch.empty_like(source)
    device = source.device
    once = bench.kernel_ms(lambda: target.copy_(source), device)
    twice = bench.kernel_ms(lambda: (target.copy_(source), target.copy_(source)), device)
    assert 0 < once <= bench.median_ms(lambda: target.copy_(source), device) * 1.2
    assert 1.7 < twice / once < 2.3


def test_kernel_times_names_each_launch_of_a_call():
    x = torch.randn(2, 3, 5, 7)
    mask = torch.randn(3, 5, 7)
    times = bench.kernel_times(lambda: torch.ops.scaled_mask_softmax.forward(x, mask, 0.5, False, "upper_left"),
                               x.device)
    assert times["scaled_mask_softmax::forward"] > 0
    assert "scaled_mask_softmax::forward" not in bench.kernel_times(lambda: x.clone(), x.device)


def test_kernel_launches_are_the_gpus_alone():
    x = torch.randn(2, 3, 5, 7)
    assert bench.kernel_launches(lambda: torch.ops.scaled_mask_softmax.forward(x, None, 0.5, False, "upper_left"),
                                 x.device) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_launches_give_each_launchs_shape():
    """Our forward kernel, launched once a call in blocks of whole warps, whatever else the call launches."""
    x = torch.randn(64, 1024, device="cuda")
    launches = bench.kernel_launches(lambda: torch.ops.scaled_mask_softmax.forward(x, None, 0.5, False, "upper_left"),
                                     x.device)
    (ours,) = [launch for launch in launches if "sms::forward" in launch["name"]]
    assert ours["block"][0] % 32 == 0 and ours["block"][1:] == [1, 1]
    assert ours["grid"][0] >= 1 and ours["registers"] > 0


def load_benchmark_script(name):
    """One of benchmarks/' scripts as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_committed_run():
    """The README's performance table is what benchmarks/summary.py makes of benchmarks/results/h200.json."""
    summary = load_benchmark_script("summary")
    rows = json.loads((ROOT / "benchmarks" / "results" / "h200.json").read_text())
    readme = (ROOT / "README.md").read_text().splitlines()
    first = readme.index(summary.TABLE_HEADER.splitlines()[0])
    last = next(i for i in range(first, len(readme)) if not readme[i].startswith("|"))
    readme_table = "\n".join(readme[first:last])
    assert readme_table == summary.markdown_table(rows)


def test_summary_figures():
    summary = load_benchmark_script("summary")
    row = {"shape": [1, 1, 2, 8], "dtype": "bfloat16", "variant": "none", "error": None, "floor_ms": 1.0,
           "copy_GBps": 4000.0}
    rows = [dict(row, **{"pass": "fwd", "ours_ms": 1.2, "compile_ms": 2.4, "eager_ms": 3.0}),
            dict(row, **{"pass": "bwd", "ours_ms": 1.0, "compile_ms": 0.99, "eager_ms": 2.0}),
            dict(row, **{"pass": "fwd+bwd", "ours_ms": 2.2, "compile_ms": 4.0, "eager_ms": 5.0}),
            {"case": "attention", "ours_ms": 1.0, "error": None}]
    lines = summary.figures(rows)
    assert f"{math.sqrt(2.0 * 0.99):.3f} over 2 forward and backward cells" in lines[1]
    # torch.compile's forward+backward, 4.0, taken as at most its forward plus its backward: 2.4 + 0.99.
    assert lines[2] == "  over the 1 forward+backward cells: 1.818, 1.541 with torch.compile's time at most its " \
                       "forward's plus its backward's"
    assert lines[3].endswith("1 of 2") and lines[4].endswith("1 of 2")
    assert "0.990-0.990 of its speed" in lines[5] and "0.990 of the floor" in lines[5]
    assert lines[-1] == "  1x1x2x8 bfloat16 none fwd 1.200"
    expected_line = "| 1×1×2×8 | bfloat16 | none | 1.20 | 2.40 | 3.00 | 1.00 | 0.99 | 2.20 | 4.00 |"
    assert summary.markdown_table(rows).splitlines()[-1] == expected_line


def test_summary_quoted_figures():
    summary = load_benchmark_script("summary")
    # x of 2^24 bf16 elements: read and written once at 4000 GB/s, 0.016777 ms.
    forward = {"case": "softmax", "shape": [1, 4, 2048, 2048], "dtype": "bfloat16", "variant": "none", "pass": "fwd",
               "ours_ms": 0.0170, "compile_ms": 0.0300, "error": None, "copy_GBps": 4000.0}
    attention = {"case": "attention", "shape": [8, 32, 1024, 1024], "dtype": "bfloat16", "variant": "causal",
                 "pass": "fwd+bwd", "ours_ms": 1.5, "eager_ms": 4.5, "compile_ms": 1.7, "sdpa_ms": 0.47, "error": None}
    host = {"case": "host_overhead", "shape": [1, 1, 4, 4], "ours_ms": 0.0105, "softmax_ms": 0.0067, "error": None}
    summary.QUOTED_FORWARDS = (((1, 4, 2048, 2048), "none"), ((1, 4, 2048, 2048), "causal"))
    lines = summary.quoted_figures([forward, attention, host])
    assert lines[1:] == ["  1x4x2048x2048 none: 1.01 / 1.79",
                         "attention 8x32x1024x1024 bfloat16 causal fwd+bwd: ours 1.50 ms, eager 4.50 (3.0x ours), "
                         "torch.compile 1.70, SDPA 0.47",
                         "host cost of a call on [1, 1, 4, 4]: ours 10.5 us, torch.softmax 6.7 us"]


def test_plain_kernels_move_what_they_say(monkeypatch):
    """benchmarks/plain.py's kernels (sweep.py --plain), run by Triton's interpreter on the CPU, on the benchmark's
    masks, against the same arithmetic in float64: each output within an ulp of x's dtype (the interpreter truncates
    to bf16 where the GPU rounds to nearest), causal rows zero past the 16-byte vectors they read."""
    pytest.importorskip("triton", minversion="3.2")  # the interpreters of Triton 3.0 and 3.1 compute NaN in bf16
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read as plain.py's kernel is decorated
    plain = load_benchmark_script("plain")
    generator = torch.Generator().manual_seed(0)
    # The second shape takes two 4096-column tiles a row.
    for shape, dtype in (((2, 4, 16, 128), torch.bfloat16), ((1, 1, 4, 8192), torch.float32)):
        vector = 16 // dtype.itemsize
        queries, keys = shape[-2:]
        seen = torch.arange(keys) // vector * vector <= torch.arange(queries)[:, None]
        for variant in bench.VARIANTS:
            x, mask, _, is_causal = bench.make_inputs(shape, dtype, variant, torch.device("cpu"), generator)
            y, dy = (torch.randn(shape, generator=generator).to(dtype) for _ in range(2))
            forward, backward = x.double(), y.double() * dy.double()
            if mask is not None and mask.dtype == torch.bool:
                forward = torch.where(mask, forward, 0.0)
            elif mask is not None:
                forward = forward + mask.double()
            if is_causal:
                forward, backward = torch.where(seen, forward, 0.0), torch.where(seen, backward, 0.0)
            movers = plain.movers(x, mask, is_causal, y, dy)
            for name, expected in (("fwd", forward), ("bwd", backward)):
                actual = movers[name]()
                assert actual.dtype == dtype, (variant, name)
                torch.testing.assert_close(actual.double(), expected, rtol=torch.finfo(dtype).eps, atol=0.0,
                                           msg=lambda text: f"{shape} {dtype} {variant} {name}: {text}")


def test_source_profile_summarizes_each_launch(tmp_path, capsys):
    """benchmarks/source_profile.py on a source page of two launches, as `ncu --page source --csv` writes it."""
    source_profile = load_benchmark_script("source_profile")
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
              "stall_short_sb", "stall_barrier (Not Issued)"]
    page = tmp_path / "source.csv"
    with page.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["Kernel Name", "void first(int)", ""])
        writer.writerow(header)
        writer.writerow(["0x0", "      @!P1  LDS.128 R8, [R9]", "30", "3000000", "0", "30", "9"])
        writer.writerow(["0x10", "      BAR.SYNC.DEFER_BLOCKING 0x0", "10", "1000000", "10", "0", "9"])
        writer.writerow(["0x20", "      EXIT", "-", "-", "-", "-", "-"])
        writer.writerow(["Kernel Name", "void second(int)", ""])
        writer.writerow(header)
        writer.writerow(["0x0", "      FADD R1, R2, R3", "5", "100", "0", "5", "0"])

    source_profile.main([str(page), "--top", "1"])
    first, second = capsys.readouterr().out.split("\n\n")
    assert first.splitlines()[:5] == [
        "void first(int)",
        "  warp instructions executed 4.0 M, warp-stall samples 40",
        "  stalls: short_sb 75.0%, barrier 25.0%",
        "  opcodes by instructions: LDS 75.0%, BAR 25.0%",
        "  opcodes by samples: LDS 75.0%, BAR 25.0%"]
    assert first.splitlines()[-1].split()[:4] == ["0", "75.00%", "3000000", "@!P1"]
    assert first.splitlines()[-1].endswith("(short_sb 30)")
    assert second.startswith("void second(int)\n  warp instructions executed 0.0 M, warp-stall samples 5")

    source_profile.main([str(page), "--kernel", "1"])
    assert capsys.readouterr().out.startswith("void second(int)")
    with pytest.raises(SystemExit):
        source_profile.main([str(page), "--kernel", "2"])
    assert "--kernel must be below 2" in capsys.readouterr().err
