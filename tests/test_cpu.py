"""The CPU engine. On x86-64 it is built three times (16-byte vectors, AVX2, AVX-512), of which the widest that
torch's own CPU kernels take runs (ATEN_CPU_CAPABILITY lowers it): its 16-bit conversions bit for bit, and the
contract's CPU tests under each build this CPU can run. Its portable builds (one lane, 16-byte vectors) also by
other compilers and for aarch64, through tests/engine_check.cpp."""
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import environment_importing_this_package
from scaled_mask_softmax import _toolkit

# From the narrowest build to the widest, as torch.backends.cpu.get_cpu_capability() names them.
CAPABILITIES = ["DEFAULT", "AVX2", "AVX512"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [2.0**-12, 0.7, 3.0, 2.0**12, 2.0**20])
def test_16_bit_loads_and_stores_are_exact(dtype, scale):
    # Rows y = [t, 0], dy = [1, 0] over every 16-bit pattern t: the row's dot is t itself, so dx = [scale * t * (1 - t),
    # scale * 0 * (0 - t)], formed in fp32 by the same operations torch performs below. Loading t must be exact and
    # rounding dx to 16 bits must round to nearest even, through subnormals, overflow, infinities and NaN.
    t = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    y = torch.stack([t, torch.zeros_like(t)], dim=1)
    dy = torch.stack([torch.ones_like(t), torch.zeros_like(t)], dim=1)
    dx = torch.ops.scaled_mask_softmax.backward(y, dy, scale, False, "upper_left")

    t32 = t.float()
    expected = torch.stack([(scale * t32) * (1 - t32), (scale * torch.zeros_like(t32)) * (0 - t32)], dim=1).to(dtype)
    nan = expected.isnan()
    assert torch.equal(dx.isnan(), nan)
    assert torch.equal(dx.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])


def test_the_library_names_the_build_that_runs():
    build, threads = torch.ops.scaled_mask_softmax.cpu_engine()
    if platform.machine().lower() in ("x86_64", "amd64"):
        expected = {"AVX512": "AVX-512", "AVX2": "AVX2"}.get(torch.backends.cpu.get_cpu_capability(), "16-byte vectors")
        assert build == expected
    # Built by the compiler setup.py asks: with GCC's OpenMP, a call takes torch's threads.
    assert threads == (torch.get_num_threads() if _toolkit.compiler_takes_openmp() else 1)


def lower_capabilities():
    """The builds below the one this process runs, where this CPU and build have them (x86-64 only)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    current = torch.backends.cpu.get_cpu_capability()
    return CAPABILITIES[:CAPABILITIES.index(current)] if current in CAPABILITIES else []


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2"])
def test_contract_under_each_build(capability, tmp_path):
    if capability not in lower_capabilities():
        pytest.skip(f"this process runs {torch.backends.cpu.get_cpu_capability()}, not above {capability}")
    tests = Path(__file__).parent
    # torch.compile's cache of CPU code is not keyed by ATEN_CPU_CAPABILITY.
    env = environment_importing_this_package(ATEN_CPU_CAPABILITY=capability.lower(),
                                             TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               str(tests / "test_contract.py"), str(tests / "test_properties.py"), str(tests / "test_cpu.py"),
               "-k", "cpu and not under_each_build and not portable and not cuda"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=tests.parent)
    assert finished.returncode == 0, finished.stdout[-5000:] + finished.stderr[-5000:]


# Compiler and flags, then what runs the program: GCC and Clang here, and both for aarch64 (NEON; Grace, Graviton,
# and Clang as on Apple silicon), whose programs run in an emulator.
ENGINE_TARGETS = {
    "gcc": (["g++"], []),
    "clang": (["clang++"], []),
    "aarch64-gcc": (["aarch64-linux-gnu-g++", "-static"], ["qemu-aarch64"]),
    "aarch64-clang": (["clang++", "--target=aarch64-linux-gnu", "-static"], ["qemu-aarch64"]),
}


@pytest.mark.parametrize("target", ENGINE_TARGETS)
def test_portable_builds_on_other_compilers_and_targets(target, tmp_path):
    compiler, runner = ENGINE_TARGETS[target]
    # Clang's aarch64 build takes its C++ library from the GCC cross toolchain.
    tools = [compiler[0], *runner] + (["aarch64-linux-gnu-g++"] if target == "aarch64-clang" else [])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/run installs them where apt-get can)")
    program = tmp_path / "engine_check"
    include = Path(torch.__file__).parent / "include"
    source = Path(__file__).parent / "engine_check.cpp"
    built = subprocess.run([*compiler, "-std=c++20", "-O2", f"-I{include}", str(source), "-o", str(program)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-5000:]
    finished = subprocess.run([*runner, str(program)], capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0 and finished.stdout.endswith("ok\n"), finished.stdout[-5000:]
