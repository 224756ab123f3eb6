"""The spill report reads ptxas's resource lines from a build log."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "spill_report.py"
spec = importlib.util.spec_from_file_location("spill_report", SCRIPT)
spill_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spill_report)

LOG = """ptxas info    : Compiling entry function '_Z4fastv' for 'sm_90'
ptxas info    : Function properties for _Z4fastv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem
ptxas info    : Function properties for _Z4slowv
    16 bytes stack frame, 12 bytes spill stores, 24 bytes spill loads
ptxas info    : Function properties for _Z7indexedv
    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
# The same log with nothing spilled: only _Z7indexedv's stack frame (and _Z4slowv's, now without spills) remain.
NO_SPILLS = LOG.replace("12 bytes spill stores, 24 bytes spill loads", "0 bytes spill stores, 0 bytes spill loads")


def test_only_spilling_kernels_are_listed():
    assert spill_report.spilling_kernels(LOG) == {"_Z4slowv": (16, 12, 24)}


def test_kernels_that_keep_a_stack_frame_without_spilling_are_listed_apart(tmp_path, capsys):
    assert spill_report.kernels_with_a_frame(LOG) == {"_Z7indexedv": 64}
    log = tmp_path / "build.log"
    log.write_text(NO_SPILLS)
    assert spill_report.main([str(log)]) == 0
    out = capsys.readouterr().out
    assert "0 kernels spill, 2 more keep a stack frame" in out
    assert "64 B frame, no spill  indexed()" in out


def test_strict_fails_on_a_stack_frame_and_passes_without_one(tmp_path):
    log = tmp_path / "build.log"
    log.write_text(NO_SPILLS)
    assert spill_report.main([str(log), "--strict"]) == 1
    log.write_text(LOG.split("ptxas info    : Function properties for _Z4slowv")[0])
    assert spill_report.main([str(log), "--strict"]) == 0


def test_strict_fails_on_spills_and_on_a_log_without_a_report(tmp_path, capsys):
    log = tmp_path / "build.log"
    log.write_text(LOG)
    assert spill_report.main([str(log)]) == 0
    assert spill_report.main([str(log), "--strict"]) == 1
    assert "slow()" in capsys.readouterr().out
    log.write_text("no resource report here\n")
    assert spill_report.main([str(log), "--strict"]) == 1
