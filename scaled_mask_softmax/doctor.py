"""python -m scaled_mask_softmax doctor: the toolkit, the build and the GPU checked, with the fix for each problem.

Every check is a function of its inputs (an environment dict, paths, command output) returning findings, so the
tests can stage each misconfiguration without a GPU. `diagnose` gathers the facts of this machine and runs them.
Only FAIL findings (the kernels cannot load, a smoke test fails, the GPU cannot run) make the doctor exit 1;
build traps are warnings, since installed kernels that pass their smoke test work whatever the toolkit says now.
"""
import argparse
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from . import _build, _toolkit
from .ops import scaled_mask_softmax
from .reference import scaled_mask_softmax_reference

BUILD_INFO = Path(__file__).with_name("_build_info.json")
REBUILD = "pip install --no-build-isolation -e . (in the repository)"
SMOKE_TOLERANCE = 1e-5  # float32 against the float64 reference; fast math stays well inside it

# The first nvcc release that targets each GPU architecture, for when `nvcc --list-gpu-arch` cannot run.
FIRST_NVCC_FOR_ARCH = {
    (7, 5): (10, 0), (8, 0): (11, 0), (8, 6): (11, 1), (8, 7): (11, 4), (8, 9): (11, 8), (9, 0): (11, 8),
    (10, 0): (12, 8), (12, 0): (12, 8), (10, 3): (12, 9), (12, 1): (12, 9), (11, 0): (13, 0),
}
# nvcc 12 dropped Kepler, nvcc 13 everything before Turing.
OLDEST_ARCH_BY_NVCC_MAJOR = {11: (3, 5), 12: (5, 0), 13: (7, 5)}


class Finding(NamedTuple):
    status: str  # ok | info | warn | FAIL
    message: str
    fix: Optional[str] = None


class Nvcc(NamedTuple):
    path: Path
    root: Optional[Path]  # the toolkit it really runs from
    version: Optional[tuple]

    @property
    def release(self) -> str:
        return f"release {version_text(self.version)}" if self.version else "version unknown"

    @property
    def is_wrapper(self) -> bool:
        return self.root is not None and self.path.resolve() != (self.root / "bin" / "nvcc").resolve()


class Target(NamedTuple):
    """One architecture compiled into (or requested for) the kernels: native code (SASS) or PTX."""
    kind: str  # sass | ptx
    capability: tuple
    suffix: str = ""  # "a": this exact GPU only; "f": its family

    def __str__(self):
        prefix = "sm" if self.kind == "sass" else "compute"
        return f"{prefix}_{self.capability[0]}{self.capability[1]}{self.suffix}"


def run_command(args) -> Optional[str]:
    """stdout and stderr of a command that ran and succeeded, else None."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def version_text(version) -> str:
    return f"{version[0]}.{version[1]}"


def sm(capability) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def parse_version(text) -> Optional[tuple]:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def describe_nvcc(path) -> Optional[Nvcc]:
    if path is None or not Path(path).is_file():
        return None
    return Nvcc(Path(path), _toolkit.nvcc_toolkit_root(str(path)), _toolkit.nvcc_version(str(path)))


# torch ------------------------------------------------------------------------------------------------------

def check_torch(torch_version: str, torch_cuda: Optional[str], driver_found: bool) -> Finding:
    if torch_cuda is not None:
        return Finding("ok", f"torch {torch_version}, a CUDA {torch_cuda} build")
    if driver_found:
        return Finding("warn", f"torch {torch_version} is a CPU-only build, yet an NVIDIA driver is installed: "
                               "the GPU will not be used",
                       "install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
    return Finding("info", f"torch {torch_version} is a CPU-only build: the CPU kernels only")


def check_major(what: str, version, torch_cuda: Optional[str]) -> Optional[Finding]:
    """A toolkit of another CUDA major than torch's: torch refuses to build extensions with it."""
    if not _toolkit.other_major(version, torch_cuda):
        return None
    return Finding("warn", f"{what} is CUDA {version_text(version)}, torch is built with CUDA {torch_cuda}: "
                           "torch refuses to build extensions across CUDA major versions",
                   f"install a CUDA {parse_version(torch_cuda)[0]}.x toolkit and export CUDA_HOME=<its root>, "
                   f"or install a torch built for CUDA {version[0]}")


# the toolkit ------------------------------------------------------------------------------------------------

def check_nvcc_on_path(nvcc: Optional[Nvcc], torch_cuda: Optional[str]) -> list:
    if nvcc is None:
        return [Finding("info", "no nvcc on PATH")]
    if nvcc.is_wrapper:
        findings = [Finding("warn", f"nvcc on PATH, {nvcc.path}, is a wrapper for the toolkit at {nvcc.root} "
                                    f"({nvcc.release}): without CUDA_HOME or CUDA_PATH, torch takes "
                                    f"{nvcc.path.parent.parent} for the toolkit")]
    else:
        findings = [Finding("ok", f"nvcc on PATH: {nvcc.path} ({nvcc.release}, toolkit {nvcc.root})")]
    mismatch = check_major("the nvcc on PATH", nvcc.version, torch_cuda)
    return findings + ([mismatch] if mismatch else [])


def torch_cuda_home_guess(env) -> Optional[Path]:
    """What torch.utils.cpp_extension takes for the toolkit when CUDA_HOME is unset (no wrapper seen through)."""
    if env.get("CUDA_PATH"):
        return Path(env["CUDA_PATH"])
    nvcc = _toolkit.nvcc_on_path(env)
    if nvcc is not None:
        return Path(nvcc).parent.parent
    fallback = Path("/usr/local/cuda")
    return fallback if fallback.exists() else None


def check_cuda_home(env, path_nvcc: Optional[Nvcc], torch_cuda: Optional[str]) -> list:
    real_root = path_nvcc.root if path_nvcc else None
    torch_version = parse_version(torch_cuda)
    if real_root is not None and (torch_version is None or path_nvcc.version is None
                                  or path_nvcc.version[0] == torch_version[0]):
        export_fix = f"export CUDA_HOME={real_root}"
    elif torch_version is not None:
        export_fix = f"export CUDA_HOME=<a CUDA {torch_version[0]}.x toolkit's root>"
    else:
        export_fix = "export CUDA_HOME=<the CUDA toolkit's root>"
    cuda_home = env.get("CUDA_HOME")
    if not cuda_home:
        return check_unset_cuda_home(env, path_nvcc, torch_cuda, export_fix)

    home_nvcc = describe_nvcc(Path(cuda_home) / "bin" / "nvcc")
    if home_nvcc is None:
        return [Finding("warn", f"CUDA_HOME={cuda_home} has no bin/nvcc: a build of the CUDA kernels fails",
                        export_fix if real_root else "unset CUDA_HOME, or point it at a CUDA toolkit's root")]
    if home_nvcc.root is not None and home_nvcc.root != Path(cuda_home).resolve():
        return [Finding("warn", f"CUDA_HOME={cuda_home} is not a toolkit root: its bin/nvcc runs the toolkit at "
                                f"{home_nvcc.root}, and the build looks for headers and libcudart under {cuda_home}",
                        f"export CUDA_HOME={home_nvcc.root}")]
    findings = [Finding("ok", f"CUDA_HOME={cuda_home} ({home_nvcc.release}, toolkit {home_nvcc.root})")]
    mismatch = check_major(f"CUDA_HOME={cuda_home}", home_nvcc.version, torch_cuda)
    if mismatch:
        findings.append(mismatch)
    if real_root is not None and home_nvcc.root is not None and real_root != home_nvcc.root:
        findings.append(Finding("warn", f"the nvcc on PATH ({real_root}) and CUDA_HOME ({home_nvcc.root}) are "
                                        "different toolkits: builds use CUDA_HOME's, commands typed by hand PATH's",
                                "export PATH=$CUDA_HOME/bin:$PATH"))
    return findings


def check_unset_cuda_home(env, path_nvcc: Optional[Nvcc], torch_cuda: Optional[str], export_fix: str) -> list:
    """The toolkit this package's build takes without CUDA_HOME (_toolkit.default_cuda_home), against torch's own
    guess, which other extensions take."""
    build_home = _toolkit.default_cuda_home(env)
    guess = torch_cuda_home_guess(env)
    if build_home is None:
        if guess is not None:
            return [Finding("warn", f"CUDA_HOME is unset, and torch would take {guess}, which has no bin/nvcc: this "
                                    "package builds its CPU kernels only, and other extensions fail", export_fix)]
        if torch_cuda is None:
            return [Finding("info", "CUDA_HOME is unset and no toolkit is found (none needed: CPU-only torch)")]
        return [Finding("warn", "CUDA_HOME is unset and no CUDA toolkit is found: the CUDA kernels cannot be "
                                "built", export_fix)]
    toolkit = describe_nvcc(build_home / "bin" / "nvcc")
    if toolkit is None:
        return [Finding("warn", f"CUDA_HOME is unset, and CUDA_PATH={build_home} has no bin/nvcc: a build of the "
                                "CUDA kernels fails", export_fix)]
    if guess is not None and guess.resolve() != build_home.resolve():
        findings = [Finding("warn", f"CUDA_HOME is unset: torch would guess {guess} (from {path_nvcc.path}), which "
                                    f"is not the toolkit; this package's build sees through to {build_home} "
                                    f"({toolkit.release}), other extensions will not", export_fix)]
    else:
        findings = [Finding("ok", f"CUDA_HOME is unset: the build takes {build_home} ({toolkit.release})")]
    mismatch = check_major(f"the toolkit at {build_home}", toolkit.version, torch_cuda)
    return findings + ([mismatch] if mismatch else [])


def check_ld_library_path(env, torch_cuda: Optional[str]) -> list:
    """Folders on LD_LIBRARY_PATH holding a CUDA runtime of another major version than torch's."""
    torch_version = parse_version(torch_cuda)
    if torch_version is None:
        return []
    findings = []
    for folder in filter(None, env.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        runtimes = sorted(Path(folder).glob("libcudart.so.*")) if Path(folder).is_dir() else []
        majors = {int(m.group(1)) for m in (re.match(r"libcudart\.so\.(\d+)", r.name) for r in runtimes) if m}
        for major in sorted(majors - {torch_version[0]}):
            findings.append(Finding("warn", f"LD_LIBRARY_PATH holds {folder}, with libcudart.so.{major} (CUDA "
                                            f"{major}), torch uses CUDA {torch_cuda}: the wrong runtime can load",
                                    f"remove {folder} from LD_LIBRARY_PATH"))
    return findings or [Finding("ok", f"LD_LIBRARY_PATH holds no libcudart of another CUDA major than {torch_cuda}")]


# the driver and WSL2 ----------------------------------------------------------------------------------------

def driver_cuda_version(nvidia_smi_output: Optional[str]) -> Optional[tuple]:
    match = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", nvidia_smi_output or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_driver(nvidia_smi_output: Optional[str], torch_cuda: Optional[str]) -> list:
    if nvidia_smi_output is None:
        return [Finding("info", "nvidia-smi not found or failed: no NVIDIA driver visible")]
    driver = driver_cuda_version(nvidia_smi_output)
    torch_version = parse_version(torch_cuda)
    if driver is None or torch_version is None:
        return []
    if driver[0] < torch_version[0]:
        return [Finding("FAIL", f"the NVIDIA driver supports CUDA up to {version_text(driver)}, torch needs "
                                f"CUDA {torch_cuda}: torch cannot use the GPU",
                        "update the NVIDIA driver (on WSL2: the Windows driver)")]
    return [Finding("ok", f"the NVIDIA driver supports CUDA up to {version_text(driver)} (torch needs {torch_cuda})")]


def is_wsl(proc_version: str, wsl_folder_exists: bool) -> bool:
    return "microsoft" in proc_version.lower() or wsl_folder_exists


def check_wsl(proc_version: str, wsl_folder_exists: bool, driver, toolkit) -> list:
    if not is_wsl(proc_version, wsl_folder_exists):
        return []
    driver_text = version_text(driver) if driver else "?"
    toolkit_text = version_text(toolkit) if toolkit else "?"
    return [Finding("info", f"WSL2: nvidia-smi's 'CUDA Version' ({driver_text}) is the newest CUDA the Windows "
                            f"driver supports, nvcc --version ({toolkit_text}) the toolkit that builds: they may "
                            "differ; the driver comes from /usr/lib/wsl/lib, never install a Linux one")]


def host_compiler_refusal(nvcc: Path, env) -> Optional[str]:
    """nvcc's error where it refuses the host compiler a build hands it, or None. Preprocessing an empty CUDA file
    includes the toolkit's crt/host_config.h, which holds that release's bounds on GCC, Clang and MSVC."""
    args = [str(nvcc), "-E", "-x", "cu", os.devnull, "-o", os.devnull]
    if env.get("CC"):
        args += ["-ccbin", env["CC"]]  # as torch's build passes it
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode == 0:
        return None
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if "error" in line.lower()] or output.splitlines() or ["?"]
    # The bound, without nvcc's advice on -allow-unsupported-compiler.
    return errors[0].split(" The nvcc flag")[0].strip()


def check_host_compiler(nvcc: Nvcc, env, refusal: Optional[str]) -> Finding:
    compiler = f"CC={env['CC']}" if env.get("CC") else "nvcc's default (NVCC_CCBIN, else gcc on PATH)"
    if refusal is None:
        return Finding("ok", f"nvcc {nvcc.release} takes the host compiler, {compiler}")
    return Finding("warn", f"nvcc {nvcc.release} refuses the host compiler, {compiler}: a build of the CUDA kernels "
                           f"fails ({refusal})",
                   "export CC=<a host compiler that release supports, e.g. an older gcc> (torch's build passes it to "
                   "nvcc as -ccbin), then rebuild")


# architectures ----------------------------------------------------------------------------------------------

def parse_arch_list(value: str) -> set:
    """The targets torch's build makes of TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", "9.0a 10.0", "Hopper"), read from
    the -gencode flags of torch's own parser; its ValueError where it refuses the value ("sm_90", "9.0+ptx")."""
    # Imported first here, cpp_extension would log its own guess of the toolkit (which check_cuda_home reports).
    cpp_extension_log = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_extension_log.level
    cpp_extension_log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        cpp_extension_log.setLevel(level)
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = value
    try:
        flags = " ".join(cpp_extension._get_cuda_arch_flags())
    finally:
        if saved is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved
    return {Target("sass" if kind == "sm" else "ptx", (int(number) // 10, int(number) % 10), suffix)
            for kind, number, suffix in re.findall(r"code=(sm|compute)_(\d+)([af]?)", flags)}


def arch_list_refusal(value: str) -> Optional[str]:
    """Why torch's build refuses TORCH_CUDA_ARCH_LIST, or None."""
    try:
        parse_arch_list(value)
    except ValueError as error:
        return str(error)
    return None


def parse_cuobjdump(elf_listing: Optional[str], ptx_listing: Optional[str]) -> set:
    """Targets named in `cuobjdump --list-elf` / `--list-ptx` output (`... .sm_90.cubin`, `... .sm_90.ptx`)."""
    targets = set()
    for kind, listing in (("sass", elf_listing), ("ptx", ptx_listing)):
        for number, suffix in re.findall(r"sm_(\d+)([af]?)\.", listing or ""):
            targets.add(Target(kind, (int(number) // 10, int(number) % 10), suffix))
    return targets


def how_it_runs(targets, capability) -> Optional[str]:
    """"sass" when native code runs on this GPU, "ptx" when only the driver's JIT of PTX does, else None.

    Native code runs on later minor versions of its major; PTX on any later GPU; "a" targets on theirs only.
    """
    def runs_natively(target):
        if target.suffix == "a":
            return target.capability == capability
        return target.capability[0] == capability[0] and target.capability[1] <= capability[1]

    def runs_as_ptx(target):
        return target.capability == capability if target.suffix == "a" else target.capability <= capability

    if any(t.kind == "sass" and runs_natively(t) for t in targets):
        return "sass"
    if any(t.kind == "ptx" and runs_as_ptx(t) for t in targets):
        return "ptx"
    return None


def check_arch_list(gpu: str, capability, arch_list: Optional[str]) -> Finding:
    """TORCH_CUDA_ARCH_LIST against a GPU: what a build here would produce."""
    if not arch_list:
        return Finding("ok", f"TORCH_CUDA_ARCH_LIST is unset: a build here targets the visible GPUs ({gpu}: "
                             f"{sm(capability)})")
    fix = f"export TORCH_CUDA_ARCH_LIST=\"{version_text(capability)}\" (or unset it) and rebuild: {REBUILD}"
    runs = how_it_runs(parse_arch_list(arch_list), capability)
    if runs == "sass":
        return Finding("ok", f"TORCH_CUDA_ARCH_LIST={arch_list} covers {gpu} ({sm(capability)})")
    if runs == "ptx":
        return Finding("warn", f"TORCH_CUDA_ARCH_LIST={arch_list} reaches {gpu} ({sm(capability)}) only through "
                               "PTX, compiled by the driver at first use", fix)
    return Finding("warn", f"TORCH_CUDA_ARCH_LIST={arch_list} lacks {gpu} ({sm(capability)}): kernels built with it "
                           "cannot run there", fix)


def check_arch_list_build(arch_list: str, refusal: Optional[str], nvcc_version, archs: Optional[set]) -> Finding:
    """TORCH_CUDA_ARCH_LIST against torch's parser and the build toolkit's targets, whatever GPU is present."""
    if refusal is not None:
        return Finding("warn", f"TORCH_CUDA_ARCH_LIST={arch_list}: torch's build refuses it ({refusal})",
                       'list entries such as "9.0", "9.0a" or "10.0+PTX", separated by ";" or spaces, or unset it')
    capabilities = {target.capability for target in parse_arch_list(arch_list)}
    if nvcc_version is None or archs is None:
        return Finding("ok", f"TORCH_CUDA_ARCH_LIST={arch_list}: torch's build takes it")
    beyond = sorted(capabilities - archs)
    if not beyond:
        return Finding("ok", f"TORCH_CUDA_ARCH_LIST={arch_list}: nvcc {version_text(nvcc_version)} targets each entry")
    return Finding("warn", f"TORCH_CUDA_ARCH_LIST={arch_list}: nvcc {version_text(nvcc_version)} cannot target "
                           f"{', '.join(map(sm, beyond))}; a build fails with 'Unsupported gpu architecture'",
                   "drop them from TORCH_CUDA_ARCH_LIST, or build with a CUDA toolkit that targets them")


def toolkit_archs(list_gpu_arch_output: Optional[str]) -> Optional[set]:
    """Capabilities from `nvcc --list-gpu-arch` (compute_90, compute_100, ...), or None without its output."""
    numbers = re.findall(r"compute_(\d+)", list_gpu_arch_output or "")
    return {(int(n) // 10, int(n) % 10) for n in numbers} or None


def check_toolkit_targets(gpu: str, capability, nvcc_version, archs: Optional[set]) -> Optional[Finding]:
    """Whether the build toolkit's nvcc can compile for the GPU: too new a GPU, or one a newer nvcc dropped."""
    if nvcc_version is None:
        return None
    first = FIRST_NVCC_FOR_ARCH.get(capability)
    oldest = OLDEST_ARCH_BY_NVCC_MAJOR.get(nvcc_version[0])
    if archs is not None:
        supported = capability in archs
    elif oldest is not None and capability < oldest:
        supported = False
    elif first is not None:
        supported = first <= nvcc_version
    else:
        return Finding("info", f"cannot tell whether nvcc {version_text(nvcc_version)} targets {gpu} "
                               f"({sm(capability)}): `nvcc --list-gpu-arch` did not run")
    if supported:
        return Finding("ok", f"nvcc {version_text(nvcc_version)} can target {gpu} ({sm(capability)})")
    if first is not None and first > nvcc_version:
        fix = f"install CUDA {version_text(first)} or newer and export CUDA_HOME=<its root>"
    else:
        fix = "build with an older CUDA toolkit (and a torch built for it), or on a newer GPU"
    return Finding("warn", f"nvcc {version_text(nvcc_version)} cannot target {gpu} ({sm(capability)}): a build for "
                           "it fails with 'Unsupported gpu architecture'", fix)


def check_installed_archs(gpu: str, capability, targets: set, source: str) -> Finding:
    """The architectures inside the installed CUDA kernels against a GPU."""
    names = ", ".join(sorted(map(str, targets)))
    fix = f"rebuild for it: export TORCH_CUDA_ARCH_LIST=\"{version_text(capability)}\"; {REBUILD}"
    runs = how_it_runs(targets, capability)
    if runs == "sass":
        return Finding("ok", f"the installed CUDA kernels hold native code for {gpu} ({sm(capability)}; {source})")
    if runs == "ptx":
        return Finding("warn", f"the installed CUDA kernels reach {gpu} ({sm(capability)}) only through PTX "
                               f"({names}; {source}): the driver compiles them at first use", fix)
    return Finding("FAIL", f"the installed CUDA kernels hold no code for {gpu} ({sm(capability)}): they have "
                           f"{names or 'none'} ({source})", fix)


def installed_targets(extension: Optional[str], cuobjdump: Optional[str], build_info: Optional[dict], run):
    """(targets, where they were read) for the installed CUDA kernels, or (None, why not)."""
    if extension is not None and cuobjdump is not None:
        elf, ptx = run([cuobjdump, "--list-elf", extension]), run([cuobjdump, "--list-ptx", extension])
        if elf is not None or ptx is not None:
            return parse_cuobjdump(elf, ptx), "read by cuobjdump"
    if build_info and build_info.get("torch_cuda_arch_list"):
        return parse_arch_list(build_info["torch_cuda_arch_list"]), \
            f"build record: TORCH_CUDA_ARCH_LIST={build_info['torch_cuda_arch_list']}"
    return None, "no cuobjdump and no build record"


# the kernels ------------------------------------------------------------------------------------------------

def check_cpu_kernels(cpu_source: str) -> Finding:
    if cpu_source == "installed":
        return Finding("ok", "CPU kernels: the installed extension is loaded")
    return Finding("warn", f"CPU kernels: {cpu_source} (the installed extension is missing or failed to import)",
                   f"install them: {REBUILD}")


def cpu_engine(build: str, threads: int, torch_threads: int) -> Finding:
    """Which build of the CPU engine runs (on x86-64 the widest one that torch's own CPU kernels take, which
    ATEN_CPU_CAPABILITY lowers), and on how many threads, as the library itself says."""
    message = f"CPU engine: its {build} build runs, on {threads} thread{'s' if threads != 1 else ''}"
    if threads < torch_threads:
        return Finding("warn", f"{message} where torch takes {torch_threads}: it was compiled without GCC's OpenMP, "
                               "torch's own runtime", f"rebuild it with GCC: CXX=g++ {REBUILD}")
    return Finding("info", f"{message} (torch.set_num_threads)")


def check_cuda_kernels(torch_cuda: Optional[str], extension: Optional[str], load_error: Optional[str],
                       registered: bool, device_count: int) -> Finding:
    if torch_cuda is None:
        return Finding("info", "CUDA kernels: not used by a CPU-only torch")
    if load_error is not None:
        return Finding("FAIL", f"CUDA kernels: {extension} fails to load: {first_line(load_error)}",
                       f"rebuild them against this torch: {REBUILD}")
    if registered:
        return Finding("ok", "CUDA kernels: the installed extension is loaded")
    if device_count:
        return Finding("warn", "CUDA kernels are not installed: the first CUDA call builds them just in time "
                               "(minutes, with the toolkit above)", f"install them: {REBUILD}")
    return Finding("info", "CUDA kernels are not installed (no GPU here; the first CUDA call would build them)")


def check_build_info(build_info: Optional[dict], torch_version: str) -> list:
    if build_info is None:
        return [Finding("info", "no build record (_build_info.json): the kernels were built just in time or "
                                "before setup.py recorded builds")]
    if build_info.get("cuda"):
        summary = (f"build record: CUDA kernels built by nvcc {build_info.get('nvcc_version')} from "
                   f"{build_info.get('cuda_home')} for TORCH_CUDA_ARCH_LIST={build_info.get('torch_cuda_arch_list')}"
                   f", torch {build_info.get('torch_version')}")
    else:
        summary = f"build record: CPU kernels only, torch {build_info.get('torch_version')}"
    findings = [Finding("info", summary)]
    if build_info.get("torch_version") != torch_version:
        findings.append(Finding("warn", f"the kernels were built against torch {build_info.get('torch_version')}, "
                                        f"this is torch {torch_version}: their C++ interface may not match",
                                f"rebuild them: {REBUILD}"))
    return findings


def check_fast_math(build_info: Optional[dict], env) -> list:
    findings = []
    if build_info is not None and build_info.get("cuda"):
        if build_info.get("fast_math"):
            findings.append(Finding("warn", "the CUDA kernels were built with --use_fast_math "
                                            "(SCALED_MASK_SOFTMAX_FAST_MATH=1): exp and division are approximate",
                                    f"rebuild with SCALED_MASK_SOFTMAX_FAST_MATH unset: {REBUILD}"))
        else:
            findings.append(Finding("ok", "the CUDA kernels were built without --use_fast_math"))
    if env.get("SCALED_MASK_SOFTMAX_FAST_MATH") == "1":
        findings.append(Finding("warn", "SCALED_MASK_SOFTMAX_FAST_MATH=1 is set: the next build (or just-in-time "
                                        "build) uses --use_fast_math", "unset SCALED_MASK_SOFTMAX_FAST_MATH"))
    return findings


def check_portable_clusters(env) -> list:
    if env.get("SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS") != "1":
        return []
    return [Finding("info", "SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS=1 is set: rows too long for one block are split "
                            "over clusters of at most 8 blocks, slower for some of them",
                    "unset SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS outside compute-sanitizer's synccheck")]


def smoke_test(device: str) -> Finding:
    """The operator on a small input (bool key mask, causal, odd sizes) against the float64 reference."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 17, 45, generator=generator).to(device)
    mask = (torch.rand(2, 1, 1, 45, generator=generator) > 0.2).to(device)
    try:
        y = scaled_mask_softmax(x, mask, scale=0.125, is_causal=True)
    except Exception as error:  # the doctor reports whatever breaks rather than dying of it
        return Finding("FAIL", f"smoke test on {device}: {type(error).__name__}: {first_line(str(error))}",
                       f"rebuild the kernels: {REBUILD}")
    expected = scaled_mask_softmax_reference(x, mask, scale=0.125, is_causal=True)
    max_error = (y.double() - expected).abs().max().item()
    if max_error <= SMOKE_TOLERANCE:
        return Finding("ok", f"smoke test on {device}: max abs error {max_error:.1e} (tolerance {SMOKE_TOLERANCE})")
    return Finding("FAIL", f"smoke test on {device}: max abs error {max_error:.1e} exceeds {SMOKE_TOLERANCE}",
                   "run `python -m scaled_mask_softmax check` for the cases that fail, and rebuild the kernels")


# this machine -----------------------------------------------------------------------------------------------

def cuda_extension_state():
    """(path of the installed CUDA extension or None, the error importing it raised or None)."""
    spec = importlib.util.find_spec("scaled_mask_softmax._C_cuda")
    if spec is None:
        return None, None
    try:
        importlib.import_module("scaled_mask_softmax._C_cuda")
    except ImportError as error:
        return spec.origin, str(error)
    return spec.origin, None


def read_build_info(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def find_tool(name: str, env, folders=()) -> Optional[str]:
    """`name` on PATH, else in `folders`."""
    search = os.pathsep.join([env.get("PATH", os.defpath), *map(str, folders)])
    return shutil.which(name, path=search)


def smoke_test_devices() -> list:
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu"] + [f"cuda:{i}" for i in range(cuda_devices)]


def diagnose(env, run=run_command):
    """Yields the findings for this machine, as they come (a smoke test may build the kernels first)."""
    torch_cuda = torch.version.cuda
    nvidia_smi = find_tool("nvidia-smi", env, ["/usr/lib/wsl/lib"])
    smi_output = run([nvidia_smi]) if nvidia_smi else None
    yield check_torch(torch.__version__, torch_cuda, smi_output is not None)

    path_nvcc = describe_nvcc(_toolkit.nvcc_on_path(env))
    yield from check_nvcc_on_path(path_nvcc, torch_cuda)
    yield from check_cuda_home(env, path_nvcc, torch_cuda)
    cuda_home = _toolkit.default_cuda_home(env)
    build_nvcc = describe_nvcc(cuda_home / "bin" / "nvcc") if cuda_home else None
    if torch_cuda is not None and build_nvcc is not None:
        yield check_host_compiler(build_nvcc, env, host_compiler_refusal(build_nvcc.path, env))
    yield from check_ld_library_path(env, torch_cuda)

    yield from check_driver(smi_output, torch_cuda)
    proc_version = Path("/proc/version").read_text() if Path("/proc/version").exists() else ""
    yield from check_wsl(proc_version, Path("/usr/lib/wsl").exists(), driver_cuda_version(smi_output),
                         build_nvcc.version if build_nvcc else None)

    build_info = read_build_info(BUILD_INFO)
    extension, load_error = cuda_extension_state()
    gpus = ([(f"cuda:{i} {torch.cuda.get_device_name(i)}", torch.cuda.get_device_capability(i))
             for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [])
    if torch_cuda is not None and not gpus:
        yield Finding("info", "no CUDA device visible: the checks against a GPU's architecture are skipped")
    archs = toolkit_archs(run([str(build_nvcc.path), "--list-gpu-arch"])) if build_nvcc else None
    cuobjdump = find_tool("cuobjdump", env, [cuda_home / "bin"] if cuda_home else [])
    targets, source = installed_targets(extension, cuobjdump, build_info, run) if extension else (None, "")
    if extension and not gpus:
        held = ", ".join(sorted(map(str, targets))) if targets is not None else "unknown architectures"
        yield Finding("info", f"the installed CUDA kernels hold {held} ({source})")
    arch_list = env.get("TORCH_CUDA_ARCH_LIST")
    refusal = arch_list_refusal(arch_list) if arch_list else None
    if torch_cuda is not None and arch_list:
        yield check_arch_list_build(arch_list, refusal, build_nvcc.version if build_nvcc else None, archs)
    for gpu, capability in gpus:
        if refusal is None:
            yield check_arch_list(gpu, capability, arch_list)
        targets_finding = check_toolkit_targets(gpu, capability, build_nvcc.version if build_nvcc else None, archs)
        if targets_finding:
            yield targets_finding
        if targets is not None:
            yield check_installed_archs(gpu, capability, targets, source)

    yield check_cpu_kernels(_build.CPU_KERNELS)
    yield cpu_engine(*torch.ops.scaled_mask_softmax.cpu_engine(), torch.get_num_threads())
    yield check_cuda_kernels(torch_cuda, extension, load_error, _build.cuda_kernels_installed(), len(gpus))
    yield from check_build_info(build_info, torch.__version__)
    yield from check_fast_math(build_info, env)
    yield from check_portable_clusters(env)

    for device in smoke_test_devices():
        yield smoke_test(device)


def format_finding(finding: Finding) -> str:
    line = f"{finding.status:<5} {finding.message}"
    return line + f"\n      fix: {finding.fix}" if finding.fix else line


def verdict(findings, devices) -> tuple:
    """(exit status, the closing line)."""
    failures = sum(f.status == "FAIL" for f in findings)
    warnings = sum(f.status == "warn" for f in findings)
    if failures:
        return 1, f"verdict: NOT usable: {failures} FAIL line(s) above, each with its fix"
    note = f"; {warnings} warning(s) above" if warnings else ""
    return 0, f"verdict: usable on {', '.join(devices)}{note}"


def main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaled_mask_softmax doctor",
                                     description="Diagnose the toolkit, the build and the GPU, with the fix for "
                                                 "each problem found. Exits 1 when the package is not usable.")
    parser.parse_args(argv)
    findings = []
    for finding in diagnose(dict(os.environ)):
        print(format_finding(finding), flush=True)
        findings.append(finding)
    status, line = verdict(findings, smoke_test_devices())
    print(line)
    return status
