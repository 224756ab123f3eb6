"""Loading the compiled kernels: the installed extensions, or a just-in-time build of the same sources."""
import importlib
import sys
from pathlib import Path

import torch

from . import _toolkit

CSRC = Path(__file__).parent / "csrc"
OPERATOR = "scaled_mask_softmax::forward"


def _has_kernel(dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(OPERATOR, dispatch_key)


def _build_just_in_time(name: str, sources, with_cuda: bool, why: str) -> None:
    import os

    cuda_home = _toolkit.default_cuda_home()
    mismatch = _toolkit.toolkit_mismatch(cuda_home, torch.version.cuda) if with_cuda else None
    if mismatch:
        raise RuntimeError(f"scaled_mask_softmax: the CUDA kernels {why}, and cannot be built just in time: {mismatch}")
    if with_cuda and cuda_home is not None:
        # torch reads CUDA_HOME when cpp_extension is first imported (a wrapper nvcc would mislead it), which may
        # have been before this call (torch.compile's C++ builder imports it): its module's own value is set too.
        os.environ.setdefault("CUDA_HOME", str(cuda_home))
    from torch.utils import cpp_extension

    if with_cuda and cuda_home is not None:
        cpp_extension.CUDA_HOME = str(cuda_home)

    print(f"scaled_mask_softmax: the {'CUDA' if with_cuda else 'CPU'} kernels {why}; building them just in time "
          "(once, cached under torch's extensions folder)", file=sys.stderr)
    cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=_toolkit.cxx_flags(),
                       extra_cuda_cflags=_toolkit.cuda_flags() if with_cuda else None, with_cuda=with_cuda,
                       is_python_module=False, verbose=_toolkit.ptxas_verbose())


def _not_loaded(error: ImportError) -> str:
    """Why an installed library did not load, as the build's message says it: a broken one says what broke.
    (Hence importlib: `from . import _C` words a missing module as a circular import.)"""
    return "are not installed" if isinstance(error, ModuleNotFoundError) else f"did not load ({error})"


def load_cpu_kernels() -> str:
    """Registers the schema and CPU kernels; says where they came from."""
    try:
        importlib.import_module(f"{__package__}._C")
        return "installed"
    except ImportError as error:
        _build_just_in_time("scaled_mask_softmax_cpu", [CSRC / name for name in _toolkit.CPU_SOURCES],
                            with_cuda=False, why=_not_loaded(error))
        return "built just in time"


def _load_installed_cuda_kernels():
    """None once the installed CUDA kernels are registered; else why they are not."""
    try:
        importlib.import_module(f"{__package__}._C_cuda")
        return None
    except ImportError as error:
        return _not_loaded(error)


def load_cuda_kernels() -> None:
    """Registers the CUDA kernels, building them just in time if they were not installed."""
    global _cuda_ready
    if not _has_kernel("CUDA"):
        why = _load_installed_cuda_kernels()
        if why is not None:
            sources = [CSRC / "cuda" / name for name in _toolkit.CUDA_SOURCES]
            _build_just_in_time("scaled_mask_softmax_cuda", sources, with_cuda=True, why=why)
    _cuda_ready = True


def ensure_cuda_kernels() -> None:
    """load_cuda_kernels on first use. Not while torch.compile traces: the dispatcher's answers cannot be traced
    (fullgraph=True would refuse the call); the fake kernels, which run for real as it traces, load them then."""
    if not (_cuda_ready or torch.compiler.is_compiling()):
        load_cuda_kernels()


def cuda_kernels_installed() -> bool:
    return _has_kernel("CUDA") or _load_installed_cuda_kernels() is None


CPU_KERNELS = load_cpu_kernels()
_cuda_ready = _load_installed_cuda_kernels() is None
