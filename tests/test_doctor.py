"""`python -m scaled_mask_softmax doctor`: each build trap staged with fake toolkits and command output, no GPU."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from scaled_mask_softmax import _build, _toolkit, doctor
from scaled_mask_softmax.doctor import Finding, Target

TORCH_CUDA = "13.0"


def write_script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def fake_toolkit(root: Path, release: str) -> Path:
    """A toolkit folder whose bin/nvcc answers --version, --dryrun (naming its TOP) and -E as nvcc does: nvcc finds
    its toolkit from its own resolved location, whatever symlink it was called through."""
    write_script(root / "bin" / "nvcc", f"""case "$1" in
  --version) echo "Cuda compilation tools, release {release}, V{release}.99" ;;
  --dryrun) echo "#\\$ TOP=$(dirname "$(readlink -f "$0")")/.." >&2 ;;
  -E) exit 0 ;;
  *) exit 1 ;;
esac""")
    return root


def fake_wrapper(folder: Path, toolkit: Path) -> Path:
    """An nvcc script that execs a toolkit's nvcc, like /usr/local/bin/nvcc on many machines."""
    return write_script(folder / "nvcc", f'exec "{toolkit / "bin" / "nvcc"}" "$@"')


def statuses(findings):
    return [finding.status for finding in findings]


def nvcc_on_path(env):
    return doctor.describe_nvcc(_toolkit.nvcc_on_path(env))


# torch --------------------------------------------------------------------------------------------------------

def test_cpu_only_torch_with_a_driver_installed_is_a_warning():
    assert doctor.check_torch("2.13.0", None, driver_found=False).status == "info"
    finding = doctor.check_torch("2.13.0", None, driver_found=True)
    assert finding.status == "warn" and "CPU-only" in finding.message and finding.fix


# nvcc and CUDA_HOME -------------------------------------------------------------------------------------------

def test_wrapper_nvcc_on_path_is_seen_through_to_its_toolkit(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    wrapper = fake_wrapper(tmp_path / "usr" / "bin", toolkit)
    nvcc = nvcc_on_path({"PATH": str(wrapper.parent)})
    assert nvcc.root == toolkit.resolve() and nvcc.version == (13, 0) and nvcc.is_wrapper
    [finding] = doctor.check_nvcc_on_path(nvcc, TORCH_CUDA)
    assert finding.status == "warn" and "wrapper" in finding.message and str(toolkit.resolve()) in finding.message


def test_nvcc_in_its_toolkit_through_a_symlink_is_no_wrapper(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    (tmp_path / "cuda").symlink_to(toolkit)
    nvcc = nvcc_on_path({"PATH": str(tmp_path / "cuda" / "bin")})
    assert nvcc.root == toolkit.resolve() and not nvcc.is_wrapper
    assert statuses(doctor.check_nvcc_on_path(nvcc, TORCH_CUDA)) == ["ok"]


def test_toolkit_root_comes_from_the_dry_run_top(tmp_path):
    # A compiled launcher cannot be read like a script; nvcc's own dry run still names the toolkit it runs.
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    launcher = write_script(tmp_path / "opt" / "bin" / "nvcc", f"""case "$1" in
  --version) echo "Cuda compilation tools, release 13.0, V13.0.99" ;;
  --dryrun) echo "#\\$ _HERE_={toolkit}/bin" >&2; echo "#\\$ TOP={toolkit}/bin/.." >&2 ;;
esac""")
    nvcc = doctor.describe_nvcc(launcher)
    assert nvcc.root == toolkit.resolve() and nvcc.is_wrapper


def test_nvcc_on_path_of_another_major_than_torch(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    findings = doctor.check_nvcc_on_path(nvcc_on_path({"PATH": str(toolkit / "bin")}), TORCH_CUDA)
    assert statuses(findings) == ["ok", "warn"]
    assert "CUDA 12.4" in findings[1].message and "CUDA 13.x toolkit" in findings[1].fix


def test_cuda_home_unset_with_a_wrapper_gets_torch_guess_and_the_export(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    wrapper = fake_wrapper(tmp_path / "usr" / "bin", toolkit)
    env = {"PATH": str(wrapper.parent)}
    [finding] = doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)
    assert finding.status == "warn" and f"torch would guess {tmp_path / 'usr'}" in finding.message
    assert finding.fix == f"export CUDA_HOME={toolkit.resolve()}"


def test_cuda_home_unset_with_the_toolkit_nvcc_on_path_is_fine(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    env = {"PATH": str(toolkit / "bin")}
    assert statuses(doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)) == ["ok"]


def test_cuda_home_unset_with_a_symlinked_nvcc_outside_the_toolkit(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    link = tmp_path / "usr" / "bin" / "nvcc"
    link.parent.mkdir(parents=True)
    link.symlink_to(toolkit / "bin" / "nvcc")
    env = {"PATH": str(link.parent)}
    path_nvcc = nvcc_on_path(env)
    assert statuses(doctor.check_nvcc_on_path(path_nvcc, TORCH_CUDA)) == ["ok"]
    [finding] = doctor.check_cuda_home(env, path_nvcc, TORCH_CUDA)
    assert finding.status == "warn" and finding.fix == f"export CUDA_HOME={toolkit.resolve()}"


def test_cuda_path_is_taken_after_cuda_home_as_torch_takes_it(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    wrapper = fake_wrapper(tmp_path / "usr" / "bin", fake_toolkit(tmp_path / "cuda-12.4", "12.4"))
    env = {"PATH": str(wrapper.parent), "CUDA_PATH": str(toolkit)}
    assert _toolkit.default_cuda_home(env) == toolkit
    assert _toolkit.default_cuda_home({**env, "CUDA_HOME": str(tmp_path / "other")}) == tmp_path / "other"
    assert statuses(doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)) == ["ok"]


def test_cuda_home_unset_and_cuda_path_of_another_major_or_without_nvcc(tmp_path):
    env = {"PATH": "", "CUDA_PATH": str(fake_toolkit(tmp_path / "cuda-12.4", "12.4"))}
    findings = doctor.check_cuda_home(env, None, TORCH_CUDA)
    assert statuses(findings) == ["ok", "warn"] and "CUDA 12.4" in findings[1].message
    env["CUDA_PATH"] = str(tmp_path / "runtime-only")
    [finding] = doctor.check_cuda_home(env, None, TORCH_CUDA)
    assert finding.status == "warn" and "has no bin/nvcc" in finding.message


def test_no_fix_points_at_a_toolkit_of_another_major(tmp_path):
    old = fake_wrapper(tmp_path / "usr" / "bin", fake_toolkit(tmp_path / "cuda-12.4", "12.4"))
    env = {"PATH": str(old.parent), "CUDA_HOME": str(tmp_path / "missing")}
    [finding] = doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)
    assert finding.fix == "export CUDA_HOME=<a CUDA 13.x toolkit's root>"


def test_cuda_home_at_the_wrappers_folder_is_not_a_toolkit_root(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    wrapper = fake_wrapper(tmp_path / "usr" / "bin", toolkit)
    env = {"PATH": str(wrapper.parent), "CUDA_HOME": str(tmp_path / "usr")}
    [finding] = doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)
    assert finding.status == "warn" and "not a toolkit root" in finding.message
    assert finding.fix == f"export CUDA_HOME={toolkit.resolve()}"


def test_cuda_home_without_nvcc(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    env = {"PATH": str(toolkit / "bin"), "CUDA_HOME": str(tmp_path / "missing")}
    [finding] = doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)
    assert finding.status == "warn" and "has no bin/nvcc" in finding.message
    assert finding.fix == f"export CUDA_HOME={toolkit.resolve()}"


def test_cuda_home_set_right_leaves_the_wrapper_a_mere_warning(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    wrapper = fake_wrapper(tmp_path / "usr" / "bin", toolkit)
    env = {"PATH": str(wrapper.parent), "CUDA_HOME": str(toolkit)}
    path_nvcc = nvcc_on_path(env)
    findings = doctor.check_nvcc_on_path(path_nvcc, TORCH_CUDA) + doctor.check_cuda_home(env, path_nvcc, TORCH_CUDA)
    assert statuses(findings) == ["warn", "ok"]
    assert doctor.verdict(findings, ["cpu"])[0] == 0


def test_cuda_home_of_another_major_and_another_toolkit_than_path(tmp_path):
    path_toolkit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    home_toolkit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    env = {"PATH": str(path_toolkit / "bin"), "CUDA_HOME": str(home_toolkit)}
    findings = doctor.check_cuda_home(env, nvcc_on_path(env), TORCH_CUDA)
    assert statuses(findings) == ["ok", "warn", "warn"]
    assert "CUDA 12.4" in findings[1].message and "different toolkits" in findings[2].message


def test_a_toolkit_of_another_major_is_refused_with_the_fixes(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    message = _toolkit.toolkit_mismatch(toolkit, TORCH_CUDA)
    assert f"{toolkit} is 12.4, but torch was built with CUDA 13.0" in message
    assert "CUDA 13.x toolkit" in message and "torch built for CUDA 12" in message
    assert _toolkit.toolkit_mismatch(toolkit, "12.8") is None  # another minor: torch's build warns, and it runs
    assert _toolkit.toolkit_mismatch(toolkit, None) is None
    assert _toolkit.toolkit_mismatch(tmp_path / "missing", TORCH_CUDA) is None


def test_setup_stops_before_building_with_a_toolkit_of_another_major(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    # Whatever this torch's build, setup.py is shown one of CUDA 13.0; `--name` builds nothing.
    script = ("import runpy, sys, torch; torch.version.cuda = '13.0'; sys.argv = ['setup.py', '--name']; "
              "runpy.run_path('setup.py', run_name='__main__')")
    finished = subprocess.run([sys.executable, "-c", script], cwd=Path(_toolkit.__file__).parents[1],
                              env={**os.environ, "CUDA_HOME": str(toolkit)}, capture_output=True, text=True,
                              timeout=300)
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert f"scaled_mask_softmax: the CUDA toolkit at {toolkit} is 12.4" in finished.stderr
    assert "SCALED_MASK_SOFTMAX_CPU_ONLY=1" in finished.stderr


def test_just_in_time_build_refuses_a_toolkit_of_another_major(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit(tmp_path / "cuda-12.4", "12.4")))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(RuntimeError, match="are not installed, and cannot be built just in time: the CUDA toolkit"):
        _build._build_just_in_time("never_built", [], with_cuda=True, why="are not installed")


HOST_CONFIG_ERROR = ("/usr/local/cuda/include/crt/host_config.h:137:2: error: #error -- unsupported GNU version! "
                     "gcc versions later than 15 are not supported! The nvcc flag '-allow-unsupported-compiler' can "
                     "be used to override this version check")


def test_host_compiler_refused_by_nvcc_says_its_bound(tmp_path):
    nvcc = write_script(tmp_path / "cuda" / "bin" / "nvcc", f'echo "In file included from x.h:82," >&2\n'
                                                              f'echo "{HOST_CONFIG_ERROR}" >&2; exit 1')
    refusal = doctor.host_compiler_refusal(nvcc, {"PATH": os.defpath, "CC": "gcc-16"})
    assert refusal.endswith("error: #error -- unsupported GNU version! gcc versions later than 15 are not supported!")
    finding = doctor.check_host_compiler(doctor.Nvcc(nvcc, None, (13, 0)), {"CC": "gcc-16"}, refusal)
    assert finding.status == "warn" and "nvcc release 13.0 refuses the host compiler, CC=gcc-16" in finding.message
    assert "export CC=" in finding.fix
    assert doctor.check_host_compiler(doctor.Nvcc(nvcc, None, (13, 0)), {}, None).status == "ok"


def test_host_compiler_bound_read_from_the_real_toolkit(tmp_path):
    """A g++ that says it is GCC 16, against this machine's nvcc (its own headers hold the bound, 15 for 13.0)."""
    cuda_home = _toolkit.default_cuda_home()
    if cuda_home is None or not (cuda_home / "bin" / "nvcc").is_file():
        pytest.skip("no CUDA toolkit on this machine")
    gcc = shutil.which("g++")
    if gcc is None:
        pytest.skip("no g++ on this machine")
    nvcc = cuda_home / "bin" / "nvcc"
    version = _toolkit.nvcc_version(str(nvcc))
    newer = write_script(tmp_path / "g++", f'exec "{gcc}" -U__GNUC__ -D__GNUC__=99 "$@"')
    assert doctor.host_compiler_refusal(nvcc, {**os.environ, "CC": gcc}) is None
    refusal = doctor.host_compiler_refusal(nvcc, {**os.environ, "CC": str(newer)})
    assert refusal is not None and "unsupported GNU version" in refusal, (version, refusal)


# LD_LIBRARY_PATH, the driver, WSL2 ----------------------------------------------------------------------------

def test_ld_library_path_with_a_runtime_of_another_major(tmp_path):
    old, current = tmp_path / "cuda-12" / "lib64", tmp_path / "cuda-13" / "lib64"
    for folder, name in ((old, "libcudart.so.12"), (current, "libcudart.so.13")):
        folder.mkdir(parents=True)
        (folder / name).touch()
    env = {"LD_LIBRARY_PATH": os.pathsep.join([str(current), str(old), str(tmp_path / "missing")])}
    [finding] = doctor.check_ld_library_path(env, TORCH_CUDA)
    assert finding.status == "warn" and "libcudart.so.12" in finding.message
    assert finding.fix == f"remove {old} from LD_LIBRARY_PATH"
    assert statuses(doctor.check_ld_library_path({"LD_LIBRARY_PATH": str(current)}, TORCH_CUDA)) == ["ok"]
    assert doctor.check_ld_library_path(env, None) == []


NVIDIA_SMI = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |"


def test_driver_older_than_torch_cuda_fails():
    [finding] = doctor.check_driver(NVIDIA_SMI, TORCH_CUDA)
    assert finding.status == "FAIL" and "up to 12.4" in finding.message and "driver" in finding.fix
    assert statuses(doctor.check_driver(NVIDIA_SMI.replace("12.4", "13.0"), TORCH_CUDA)) == ["ok"]
    assert statuses(doctor.check_driver(None, TORCH_CUDA)) == ["info"]


def test_wsl_is_detected_and_the_two_versions_explained():
    proc_version = "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@1234) (gcc (GCC) 11.2.0) #1 SMP"
    assert doctor.is_wsl(proc_version, wsl_folder_exists=False)
    assert doctor.is_wsl("Linux version 6.8.0-45-generic", wsl_folder_exists=True)
    [finding] = doctor.check_wsl(proc_version, False, driver=(12, 4), toolkit=(13, 0))
    assert finding.status == "info" and "(12.4)" in finding.message and "(13.0)" in finding.message
    assert doctor.check_wsl("Linux version 6.8.0-45-generic", False, driver=None, toolkit=(13, 0)) == []


# architectures ------------------------------------------------------------------------------------------------

def test_parse_arch_list():
    assert doctor.parse_arch_list("8.0;9.0+PTX") == {Target("sass", (8, 0)), Target("sass", (9, 0)),
                                                     Target("ptx", (9, 0))}
    assert doctor.parse_arch_list("9.0a 8.6") == {Target("sass", (9, 0), "a"), Target("sass", (8, 6))}
    assert doctor.parse_arch_list("Hopper") == {Target("sass", (9, 0)), Target("ptx", (9, 0))}


@pytest.mark.parametrize("arch_list", ["sm_90", "9.0+ptx", "8.0,9.0", "10.0f"])
def test_arch_list_that_torch_refuses(arch_list):
    refusal = doctor.arch_list_refusal(arch_list)
    assert refusal is not None and arch_list in refusal
    finding = doctor.check_arch_list_build(arch_list, refusal, (13, 0), {(9, 0), (10, 0)})
    assert finding.status == "warn" and "torch's build refuses it" in finding.message


def test_arch_list_entries_the_toolkit_cannot_target():
    # Architectures every torch this package takes knows (2.4 refuses 10.0), against an old toolkit.
    finding = doctor.check_arch_list_build("8.0;8.6;9.0+PTX", None, (11, 0), {(7, 5), (8, 0)})
    assert finding.status == "warn" and "nvcc 11.0 cannot target sm_86, sm_90" in finding.message
    assert doctor.check_arch_list_build("8.0;9.0", None, (13, 0), {(8, 0), (9, 0), (10, 0)}).status == "ok"


@pytest.mark.parametrize("arch_list,capability,status", [
    ("8.0;9.0+PTX", (9, 0), "ok"),
    ("8.0", (8, 6), "ok"),          # native code runs on later minors of its major
    ("9.0a", (9, 0), "ok"),
    ("8.0", (9, 0), "warn"),        # lacks the GPU
    ("9.0a", (10, 0), "warn"),      # an "a" target runs on its own GPU only
    ("8.0+PTX", (9, 0), "warn"),    # only through the driver's JIT of PTX
    (None, (9, 0), "ok"),           # unset: a build targets the visible GPUs
])
def test_arch_list_against_the_gpu(arch_list, capability, status):
    assert doctor.check_arch_list("cuda:0 GPU", capability, arch_list).status == status


def test_arch_list_lacking_the_gpu_says_what_to_set():
    finding = doctor.check_arch_list("cuda:0 NVIDIA H200", (9, 0), "8.0")
    assert "lacks cuda:0 NVIDIA H200 (sm_90)" in finding.message
    assert 'TORCH_CUDA_ARCH_LIST="9.0"' in finding.fix


def test_gpu_newer_than_the_toolkit_from_the_table(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    # The fake nvcc knows no --list-gpu-arch, as a toolkit that cannot run would not: the table decides.
    archs = doctor.toolkit_archs(doctor.run_command([str(toolkit / "bin" / "nvcc"), "--list-gpu-arch"]))
    assert archs is None
    finding = doctor.check_toolkit_targets("cuda:0 RTX 5090", (12, 0), (12, 4), archs)
    assert finding.status == "warn" and "cannot target cuda:0 RTX 5090 (sm_120)" in finding.message
    assert "CUDA 12.8 or newer" in finding.fix
    assert doctor.check_toolkit_targets("cuda:0", (12, 0), (12, 8), None).status == "ok"


def test_gpu_dropped_by_a_newer_toolkit():
    finding = doctor.check_toolkit_targets("cuda:0 V100", (7, 0), (13, 0), None)
    assert finding.status == "warn" and "older CUDA toolkit" in finding.fix


def test_toolkit_targets_from_list_gpu_arch():
    archs = doctor.toolkit_archs("compute_50\ncompute_80\ncompute_90\n")
    assert archs == {(5, 0), (8, 0), (9, 0)}
    assert doctor.check_toolkit_targets("cuda:0", (9, 0), (12, 4), archs).status == "ok"
    assert doctor.check_toolkit_targets("cuda:0", (12, 0), (12, 4), archs).status == "warn"


CUOBJDUMP_ELF = "ELF file    1: _C_cuda.1.sm_80.cubin\nELF file    2: _C_cuda.2.sm_90a.cubin\n"
CUOBJDUMP_PTX = "PTX file    1: _C_cuda.1.sm_90.ptx\n"


def test_parse_cuobjdump():
    assert doctor.parse_cuobjdump(CUOBJDUMP_ELF, CUOBJDUMP_PTX) == {
        Target("sass", (8, 0)), Target("sass", (9, 0), "a"), Target("ptx", (9, 0))}


def test_installed_kernels_without_code_for_the_gpu_fail():
    targets = doctor.parse_cuobjdump(CUOBJDUMP_ELF, CUOBJDUMP_PTX)
    assert doctor.check_installed_archs("cuda:0", (9, 0), targets, "cuobjdump").status == "ok"
    assert doctor.check_installed_archs("cuda:0", (10, 0), targets, "cuobjdump").status == "warn"  # PTX
    finding = doctor.check_installed_archs("cuda:0", (7, 5), targets, "cuobjdump")
    assert finding.status == "FAIL" and "sm_75" in finding.message and 'TORCH_CUDA_ARCH_LIST="7.5"' in finding.fix


def test_installed_targets_read_by_cuobjdump_else_from_the_build_record():
    outputs = {"--list-elf": CUOBJDUMP_ELF, "--list-ptx": CUOBJDUMP_PTX}

    def run(args):
        return outputs[args[1]]

    build_info = {"cuda": True, "torch_cuda_arch_list": "8.0"}
    targets, source = doctor.installed_targets("/x/_C_cuda.so", "/cuda/bin/cuobjdump", build_info, run)
    assert Target("ptx", (9, 0)) in targets and "cuobjdump" in source
    targets, source = doctor.installed_targets("/x/_C_cuda.so", None, build_info, run)
    assert targets == {Target("sass", (8, 0))} and "build record" in source
    assert doctor.installed_targets("/x/_C_cuda.so", None, None, run)[0] is None


# the kernels and the build record -----------------------------------------------------------------------------

def test_kernel_states():
    assert doctor.check_cpu_kernels("installed").status == "ok"
    assert doctor.check_cpu_kernels("built just in time").status == "warn"
    assert doctor.cpu_engine("AVX-512", 2, 2) == Finding("info", "CPU engine: its AVX-512 build runs, on 2 threads "
                                                                 "(torch.set_num_threads)")
    one_thread = doctor.cpu_engine("16-byte vectors", 1, 8)
    assert one_thread.status == "warn" and "on 1 thread where torch takes 8" in one_thread.message
    assert "CXX=g++" in one_thread.fix
    assert doctor.check_cuda_kernels(None, None, None, False, 0).status == "info"
    failure = doctor.check_cuda_kernels(TORCH_CUDA, "/x/_C_cuda.so", "undefined symbol: _ZN3c10", False, 1)
    assert failure.status == "FAIL" and "undefined symbol" in failure.message
    assert doctor.check_cuda_kernels(TORCH_CUDA, "/x/_C_cuda.so", None, True, 1).status == "ok"
    assert doctor.check_cuda_kernels(TORCH_CUDA, None, None, False, 1).status == "warn"  # just in time
    assert doctor.check_cuda_kernels(TORCH_CUDA, None, None, False, 0).status == "info"


BUILD_INFO = {"cuda": True, "cuda_home": "/usr/local/cuda", "nvcc_version": "13.0", "torch_cuda_arch_list": "9.0",
              "fast_math": False, "torch_version": "2.14.1+cu130"}


def test_fast_math_from_the_build_record():
    assert statuses(doctor.check_fast_math(BUILD_INFO, {})) == ["ok"]
    [finding] = doctor.check_fast_math({**BUILD_INFO, "fast_math": True}, {})
    assert finding.status == "warn" and "--use_fast_math" in finding.message
    assert "SCALED_MASK_SOFTMAX_FAST_MATH unset" in finding.fix
    assert doctor.check_fast_math({**BUILD_INFO, "cuda": False}, {}) == []
    assert doctor.check_fast_math(None, {}) == []
    assert statuses(doctor.check_fast_math(BUILD_INFO, {"SCALED_MASK_SOFTMAX_FAST_MATH": "1"})) == ["ok", "warn"]


def test_portable_clusters_said_where_set():
    assert doctor.check_portable_clusters({}) == []
    [finding] = doctor.check_portable_clusters({"SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS": "1"})
    assert finding.status == "info" and "at most 8 blocks" in finding.message
    assert "unset SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS" in finding.fix


def test_build_record_of_another_torch():
    assert statuses(doctor.check_build_info(BUILD_INFO, "2.14.1+cu130")) == ["info"]
    findings = doctor.check_build_info(BUILD_INFO, "2.15.0+cu130")
    assert statuses(findings) == ["info", "warn"] and "2.14.1+cu130" in findings[1].message
    assert statuses(doctor.check_build_info(None, "2.14.1+cu130")) == ["info"]


def test_read_build_info(tmp_path):
    assert doctor.read_build_info(tmp_path / "missing.json") is None
    (tmp_path / "info.json").write_text('{"cuda": false}')
    assert doctor.read_build_info(tmp_path / "info.json") == {"cuda": False}


# the smoke test, the verdict, the whole run -------------------------------------------------------------------

def test_smoke_test_on_cpu_passes():
    finding = doctor.smoke_test("cpu")
    assert finding.status == "ok" and "max abs error" in finding.message


def test_verdict_and_layout():
    assert doctor.verdict([Finding("ok", "a"), Finding("warn", "b")], ["cpu"]) == \
        (0, "verdict: usable on cpu; 1 warning(s) above")
    assert doctor.verdict([Finding("FAIL", "c", "do this")], ["cpu"])[0] == 1
    assert doctor.format_finding(Finding("warn", "b", "do this")) == "warn  b\n      fix: do this"


def test_a_staged_broken_machine_ends_not_usable(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # whatever this torch's build: the toolkit is a major behind
    toolkit = fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    wrapper = fake_wrapper(tmp_path / "usr" / "bin", toolkit)
    write_script(tmp_path / "usr" / "bin" / "nvidia-smi", "exit 0")
    old_runtime = tmp_path / "lib"
    old_runtime.mkdir()
    (old_runtime / "libcudart.so.12").touch()
    env = {"PATH": str(wrapper.parent), "LD_LIBRARY_PATH": str(old_runtime)}

    def run(args):
        return NVIDIA_SMI if Path(args[0]).name == "nvidia-smi" else doctor.run_command(args)

    findings = list(doctor.diagnose(env, run))
    messages = "\n".join(finding.message for finding in findings)
    assert "wrapper" in messages and "CUDA 12.4" in messages and "libcudart.so.12" in messages
    assert "smoke test on cpu" in messages
    assert doctor.verdict(findings, ["cpu"])[0] == 1  # the driver is older than torch's CUDA


def test_main_on_this_machine(capsys):
    assert doctor.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("verdict: usable on cpu")
    assert any(line.startswith("ok    smoke test on cpu") for line in lines)
    assert all(line.split()[0] in ("ok", "info", "warn", "FAIL", "fix:", "verdict:") for line in lines)


def test_openmp_is_asked_of_the_compiler_that_builds(tmp_path):
    assert not _toolkit.compiler_takes_openmp({"CXX": "false"})
    assert not _toolkit.compiler_takes_openmp({"CXX": str(tmp_path / "no-such-compiler")})
    if sys.platform.startswith("linux") and shutil.which("g++"):
        assert _toolkit.compiler_takes_openmp({"CXX": "g++"})
        # Clang's -fopenmp calls LLVM's runtime (__kmpc_fork_call), which torch does not load: a library built so
        # fails to import. A compiler that says it is clang stands in for it.
        assert not _toolkit.compiler_takes_openmp({"CXX": "g++ -D__clang__=1"})


def test_a_library_that_does_not_load_says_why_it_is_rebuilt():
    assert _build._not_loaded(ModuleNotFoundError("No module named 'scaled_mask_softmax._C'")) == "are not installed"
    broken = ImportError("_C.so: undefined symbol: __kmpc_fork_call")
    assert _build._not_loaded(broken) == "did not load (_C.so: undefined symbol: __kmpc_fork_call)"


def test_kernels_are_loaded_outside_what_torch_compile_traces(monkeypatch):
    """A process's first GPU call may be compiled with fullgraph=True: checking the dispatcher for the CUDA kernels
    cannot be traced, so tracing skips it, and the fake kernels (which run for real while tracing) load them."""
    loads = []
    monkeypatch.setattr(_build, "_cuda_ready", False)
    monkeypatch.setattr(_build, "load_cuda_kernels", lambda: loads.append("loaded"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: (_build.ensure_cuda_kernels(), x + 1)[1], fullgraph=True, backend="eager")
    assert torch.equal(compiled(torch.zeros(3)), torch.ones(3)) and not loads
    with FakeTensorMode():
        torch.ops.scaled_mask_softmax.forward(torch.empty(2, 3, device="cuda"), None, 1.0, False, "upper_left")
        torch.ops.scaled_mask_softmax.backward(torch.empty(2, 3, device="cuda"), torch.empty(2, 3, device="cuda"), 1.0)
    assert loads == ["loaded", "loaded"]
