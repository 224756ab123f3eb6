"""Builds the CPU kernels always, and the CUDA kernels where torch is a CUDA build and nvcc is found.

Environment: TORCH_CUDA_ARCH_LIST (default with no GPU visible: 8.0;9.0+PTX), CUDA_HOME,
SCALED_MASK_SOFTMAX_CPU_ONLY=1 (skip CUDA), SCALED_MASK_SOFTMAX_FAST_MATH=1 (nvcc --use_fast_math),
SCALED_MASK_SOFTMAX_PTXAS_VERBOSE=1 (print each kernel's registers, shared memory and spills).
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
PACKAGE = "scaled_mask_softmax"
CSRC = Path(PACKAGE) / "csrc"


def load_toolkit_module():
    spec = importlib.util.spec_from_file_location("_toolkit", ROOT / PACKAGE / "_toolkit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


toolkit = load_toolkit_module()
# torch reads CUDA_HOME when cpp_extension is imported, so it is settled first.
cuda_home = toolkit.default_cuda_home()
if cuda_home is not None:
    os.environ["CUDA_HOME"] = str(cuda_home)

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def want_cuda():
    if os.environ.get("SCALED_MASK_SOFTMAX_CPU_ONLY") == "1":
        return False
    # torch takes /usr/local/cuda for the toolkit wherever it exists, nvcc or not (a runtime-only image).
    return (torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
            and any((Path(cpp_extension.CUDA_HOME) / "bin" / nvcc).exists() for nvcc in ("nvcc", "nvcc.exe")))


def cuda_arch_list():
    """TORCH_CUDA_ARCH_LIST; when unset, what torch would target (the visible GPUs, the newest also as PTX), or
    with no GPU visible Ampere and Hopper, plus PTX for newer GPUs."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if not torch.cuda.is_available():
        return "8.0;9.0+PTX"
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in capabilities) + "+PTX"


def write_build_info(with_cuda, folder):
    """Records how the kernels were built in `folder`/_build_info.json, for `python -m scaled_mask_softmax doctor`."""
    nvcc_version = toolkit.nvcc_version(str(Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc")) if with_cuda else None
    info = {
        "cuda": with_cuda,
        "cuda_home": cpp_extension.CUDA_HOME if with_cuda else None,
        "nvcc_version": f"{nvcc_version[0]}.{nvcc_version[1]}" if nvcc_version else None,
        "torch_cuda_arch_list": cuda_arch_list() if with_cuda else None,
        "fast_math": with_cuda and "--use_fast_math" in toolkit.cuda_flags(),
        "torch_version": torch.__version__,
    }
    (folder / "_build_info.json").write_text(json.dumps(info, indent=2) + "\n")


# Asked once: cxx_flags() runs the compiler to see whether it takes -fopenmp for torch's OpenMP runtime.
cxx_flags = toolkit.cxx_flags()
if sys.platform.startswith("linux") and "-fopenmp" not in cxx_flags:
    print("scaled_mask_softmax: the C++ compiler does not compile -fopenmp with <omp.h> for GCC's OpenMP runtime, "
          "torch's own: the CPU kernels will run on one thread")
extensions = [cpp_extension.CppExtension(f"{PACKAGE}._C", [str(CSRC / name) for name in toolkit.CPU_SOURCES],
                                         extra_compile_args={"cxx": cxx_flags})]
with_cuda = want_cuda()
if with_cuda:
    mismatch = toolkit.toolkit_mismatch(cpp_extension.CUDA_HOME, torch.version.cuda)
    if mismatch:
        sys.exit(f"scaled_mask_softmax: {mismatch}; or set SCALED_MASK_SOFTMAX_CPU_ONLY=1 to build the CPU kernels "
                 "alone")
    # Set for torch's build too, so that what is built is what the build record says.
    os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list()
    print(f"scaled_mask_softmax: building the CUDA kernels with {cpp_extension.CUDA_HOME}/bin/nvcc for "
          f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}")
    extensions.append(cpp_extension.CUDAExtension(
        f"{PACKAGE}._C_cuda",
        [str(CSRC / "cuda" / name) for name in ("module.cpp",) + toolkit.CUDA_SOURCES],
        extra_compile_args={"cxx": cxx_flags, "nvcc": toolkit.cuda_flags()}))
else:
    print("scaled_mask_softmax: building the CPU kernels only (no CUDA build of torch, or no nvcc found)")


class BuildRecorded(cpp_extension.BuildExtension):
    """The build, recorded once it succeeded (a failed one leaves the record of the libraries in place): in the
    source tree, and where a wheel's build put the package's files already (build_py runs before build_ext)."""

    def run(self):
        super().run()
        if not with_cuda and (self.inplace or getattr(self, "editable_mode", False)):
            # A CUDA library an earlier build left in the tree would still load.
            for stale in (ROOT / PACKAGE).glob("_C_cuda*"):
                stale.unlink()
        write_build_info(with_cuda, ROOT / PACKAGE)
        if not self.inplace and Path(self.build_lib, PACKAGE).is_dir():
            write_build_info(with_cuda, Path(self.build_lib, PACKAGE))


setup(
    ext_modules=extensions,
    cmdclass={"build_ext": BuildRecorded},
)
