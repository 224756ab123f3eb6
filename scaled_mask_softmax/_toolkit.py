"""What setup.py and the just-in-time build share (no torch import): the C++ sources, the compiler flags,
and finding the CUDA toolkit an `nvcc` really belongs to."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


def nvcc_toolkit_root(nvcc: str = "nvcc"):
    """The toolkit folder `nvcc` runs from, wrapper scripts and symlinks seen through; None without nvcc.

    nvcc's own dry run names its toolkit (`TOP=...`), which stays right when `nvcc` on PATH is a script that
    execs another toolkit's compiler (the classic reason for a wrong CUDA_HOME).
    """
    path = shutil.which(nvcc)
    if path is None:
        return None
    try:
        dry_run = subprocess.run([path, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True,
                                 text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"TOP=(\S+)", dry_run.stdout + dry_run.stderr)
    if match:
        return Path(match.group(1)).resolve()
    return Path(path).resolve().parent.parent


def nvcc_version(nvcc: str):
    """`(major, minor)` from `nvcc --version`, or None when it cannot be run."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def other_major(version, torch_cuda) -> bool:
    """Whether a toolkit of `(major, minor)` `version` is of another CUDA major than torch's `torch_cuda` ("13.0");
    False where either is unknown."""
    return version is not None and torch_cuda is not None and version[0] != int(torch_cuda.split(".")[0])


def toolkit_mismatch(cuda_home, torch_cuda):
    """Why the toolkit at `cuda_home` cannot build kernels for a torch built with CUDA `torch_cuda`, or None. Another
    major version is refused: torch's setup build refuses it too, but its just-in-time build would link the
    toolkit's CUDA runtime beside torch's own."""
    if cuda_home is None or torch_cuda is None:
        return None
    version = nvcc_version(str(Path(cuda_home) / "bin" / "nvcc"))
    if not other_major(version, torch_cuda):
        return None
    return (f"the CUDA toolkit at {cuda_home} is {version[0]}.{version[1]}, but torch was built with CUDA "
            f"{torch_cuda}: the kernels need a toolkit of the same major version. Point CUDA_HOME at a CUDA "
            f"{torch_cuda.split('.')[0]}.x toolkit, or install a torch built for CUDA {version[0]}")


def nvcc_on_path(env=None):
    """The `nvcc` that PATH in `env` (default: this process's environment) finds, or None."""
    env = os.environ if env is None else env
    return shutil.which("nvcc", path=env.get("PATH", os.defpath))


def default_cuda_home(env=None):
    """The toolkit to build with, in torch's order but with a wrapper nvcc seen through: CUDA_HOME, else CUDA_PATH,
    else the toolkit of the nvcc on PATH, else /usr/local/cuda if it holds bin/nvcc."""
    env = os.environ if env is None else env
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(variable):
            return Path(env[variable])
    nvcc = nvcc_on_path(env)
    root = nvcc_toolkit_root(nvcc) if nvcc is not None else None
    if root is not None:
        return root
    fallback = Path("/usr/local/cuda")
    return fallback if (fallback / "bin" / "nvcc").exists() else None


# The `_C` library, in csrc/: schema and CPU kernels, and the autograd kernel every device shares.
CPU_SOURCES = ("scaled_mask_softmax.cpp", "autograd.cpp")
# The CUDA kernels, in csrc/cuda/: the forward's launches in a file a dtype, which a build compiles side by side.
CUDA_SOURCES = ("forward.cu", "forward_half.cu", "forward_bfloat16.cu", "forward_float.cu", "forward_double.cu",
                "backward.cu")


def compiler_takes_openmp(env=None) -> bool:
    """Whether the C++ compiler (CXX in `env`, default this process's environment, else c++) compiles with
    -fopenmp on Linux, <omp.h> included (torch's headers include it under that flag), for GCC's OpenMP runtime:
    torch's Linux wheels load that one (libgomp). Clang's and Intel's compilers call LLVM's runtime instead, which
    is not loaded, and a library they built with the flag would not load."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux"):
        return False
    source = ("#include <omp.h>\n"
              "#if defined(__clang__) || defined(__INTEL_COMPILER) || !defined(__GNUC__)\n"
              "#error OpenMP runtime other than libgomp\n"
              "#endif\n")
    try:
        compiled = subprocess.run(shlex.split(env.get("CXX", "c++")) + ["-fopenmp", "-fsyntax-only", "-x", "c++", "-"],
                                  input=source, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return compiled.returncode == 0


def cxx_flags():
    """C++ flags shared by setup.py and the just-in-time build. -fopenmp where the compiler takes it (on Linux):
    torch's wheels there run `at::parallel_for` through OpenMP in their own headers, which code compiled without it
    runs on one thread. Only the compile takes the flag, not the link, so that the runtime is the one torch loaded
    (libtorch_cpu's), never a second copy."""
    return ["-O3"] + (["-fopenmp"] if compiler_takes_openmp() else [])


def cuda_flags():
    """nvcc flags shared by setup.py and the just-in-time build."""
    flags = ["-O3", "--expt-relaxed-constexpr"]
    if os.environ.get("SCALED_MASK_SOFTMAX_FAST_MATH") == "1":
        flags.append("--use_fast_math")
    if ptxas_verbose():
        flags.append("-Xptxas=-v")
    return flags


def ptxas_verbose() -> bool:
    """Whether the build prints each kernel's registers, shared memory and spills (the just-in-time build shows its
    compiler's output then, which it hides otherwise)."""
    return os.environ.get("SCALED_MASK_SOFTMAX_PTXAS_VERBOSE") == "1"
