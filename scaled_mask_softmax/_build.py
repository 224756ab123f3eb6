"""Loading the compiled kernels: the installed extensions, or a just-in-time build of the same sources."""
import sys
from pathlib import Path

import torch

from . import _toolkit

CSRC = Path(__file__).parent / "csrc"
OPERATOR = "scaled_mask_softmax::forward"


def _has_kernel(dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(OPERATOR, dispatch_key)


def _build_just_in_time(name: str, sources, with_cuda: bool) -> None:
    import os

    cuda_home = _toolkit.default_cuda_home()
    if with_cuda and cuda_home is not None:
        # torch reads CUDA_HOME when cpp_extension is first imported; a wrapper nvcc would mislead it.
        os.environ.setdefault("CUDA_HOME", str(cuda_home))
    from torch.utils import cpp_extension

    print(f"scaled_mask_softmax: the {'CUDA' if with_cuda else 'CPU'} kernels are not installed; building them "
          "just in time (once, cached under torch's extensions folder)", file=sys.stderr)
    cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=_toolkit.cxx_flags(),
                       extra_cuda_cflags=_toolkit.cuda_flags() if with_cuda else None, with_cuda=with_cuda,
                       is_python_module=False)


def load_cpu_kernels() -> str:
    """Registers the schema and CPU kernels; says where they came from."""
    try:
        from . import _C  # noqa: F401
        return "installed"
    except ImportError:
        _build_just_in_time("scaled_mask_softmax_cpu", [CSRC / name for name in _toolkit.CPU_SOURCES],
                            with_cuda=False)
        return "built just in time"


def _try_installed_cuda_kernels() -> bool:
    try:
        from . import _C_cuda  # noqa: F401
        return True
    except ImportError:
        return False


_cuda_ready = False


def ensure_cuda_kernels() -> None:
    """Makes sure the CUDA kernels are registered, building them on first use if they were not installed."""
    global _cuda_ready
    if _cuda_ready:
        return
    if not _has_kernel("CUDA") and not _try_installed_cuda_kernels():
        sources = [CSRC / "cuda" / name for name in _toolkit.CUDA_SOURCES]
        _build_just_in_time("scaled_mask_softmax_cuda", sources, with_cuda=True)
    _cuda_ready = True


def cuda_kernels_installed() -> bool:
    return _has_kernel("CUDA") or _try_installed_cuda_kernels()


CPU_KERNELS = load_cpu_kernels()
_try_installed_cuda_kernels()
