"""The public operator: argument checks, the torch.ops call and fake kernels (reverse-mode autograd is in
csrc/autograd.cpp; forward mode and torch.func transforms, which C++ autograd cannot serve, in _transforms.py)."""
import math
import numbers

import torch
import torch._C._functorch as _functorch
import torch.autograd.forward_ad as forward_ad

from . import _build
from ._transforms import TransformableSoftmax

CAUSAL_VARIANTS = ("upper_left", "lower_right")
# The overload itself: calling it skips the overload resolution of torch.ops.scaled_mask_softmax.forward(...).
_forward_op = torch.ops.scaled_mask_softmax.forward.default
X_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_arguments(x, mask, scale, is_causal, causal_variant):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("x must have at least 1 dim (softmax runs over the last), got a 0-d tensor")
    _check_options(scale, is_causal, causal_variant)
    if is_causal and x.dim() < 2:
        raise ValueError(f"is_causal=True needs x with at least 2 dims [..., Sq, Sk], got shape {tuple(x.shape)}")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be None or a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"mask must be bool (True = attend) or floating (added to the scores), got {mask.dtype}")
    if mask.device != x.device:
        raise ValueError(f"mask must be on x's device ({x.device}), got {mask.device}")
    # Whether the mask broadcasts to x is left to the operator (csrc/binding.h), where it costs next to nothing.


def _not_dense(name, tensor):
    """What is wrong with a tensor whose layout the kernels do not read (sparse, nested, mkldnn); None if nothing."""
    if tensor.is_nested:
        return f"{name} must be a dense (strided) tensor, got a nested tensor (layout {tensor.layout})"
    if tensor.layout != torch.strided:
        return f"{name} must be a dense (strided) tensor, got layout {tensor.layout}"
    return None


def _type_name(value):
    """`int`, `numpy.bool`: a type outside the builtins named with its module, so that numpy.bool is not `bool`."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_options(scale, is_causal, causal_variant):
    # A float is let through first: isinstance against numbers.Real costs about half a microsecond a call.
    if type(scale) is not float and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a real number, got {_type_name(scale)}")
    try:
        finite = math.isfinite(scale)
    except OverflowError:
        raise ValueError(f"scale must be finite, got {_type_name(scale)} beyond a float's range") from None
    if not finite:
        raise ValueError(f"scale must be finite, got {scale}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {_type_name(is_causal)}")
    if causal_variant not in CAUSAL_VARIANTS:
        raise ValueError(f"causal_variant must be 'upper_left' or 'lower_right', got {causal_variant!r}")


# torch.compile of torch 2.4 cannot trace torch._C._are_functorch_transforms_active() (later versions take its value
# while tracing): there a compiled call is taken to run under no transform.
_COMPILE_TRACES_TRANSFORM_CHECK = torch.__version__ >= (2, 5)


def _transforms_active():
    """Whether a torch.func transform other than functionalize is active, which the operators' C++ autograd cannot
    serve."""
    if not _COMPILE_TRACES_TRANSFORM_CHECK and torch.compiler.is_compiling():
        return False
    return torch._C._are_functorch_transforms_active() and not _functionalized()


def _functionalized():
    """Whether torch.func.functionalize is among the transforms active. It has no rule for an autograd.Function such
    as TransformableSoftmax (torch raises NYI); the operator itself, which mutates nothing, needs none, and vmap
    takes its batching rules."""
    stack = _functorch.get_interpreter_stack() if hasattr(_functorch, "get_interpreter_stack") else None
    stack = stack or [_functorch.peek_interpreter_stack()]
    return any(interpreter.key() == _functorch.TransformType.Functionalize for interpreter in stack)


def scaled_mask_softmax(x, mask=None, scale=1.0, is_causal=False, causal_variant="upper_left"):
    """`softmax(x * scale + mask)` over the last dim, in one fused kernel.

    x: `[..., Sq, Sk]` float16, bfloat16, float32 or float64, dense (not sparse or nested), any strides.
    mask: None; bool (True = attend, as in F.scaled_dot_product_attention); or floating, added to the scores
        (-inf masks). It must broadcast to x and is read through its strides, never expanded in memory.
    scale: multiplies x before the mask is added; scores are formed in fp32 (fp64 for fp64).
    is_causal: query i cannot see key j > i ("upper_left") or j > i + Sk - Sq ("lower_right", for a KV cache).
    A row with every position masked comes out as zeros (with zero gradient), never NaN.
    """
    _check_arguments(x, mask, scale, is_causal, causal_variant)
    if x.is_cuda:
        _build.ensure_cuda_kernels()
    try:
        if forward_ad._current_level >= 0 or _transforms_active():
            return TransformableSoftmax.apply(x, mask, float(scale), is_causal, causal_variant)
        return _forward_op(x, mask, float(scale), is_causal, causal_variant)
    except NotImplementedError:
        # The dispatcher refuses sparse, nested and mkldnn tensors in words that name no argument. Looked at only
        # then: checked up front, layouts would add to every call's host time.
        problem = _not_dense("x", x) or (_not_dense("mask", mask) if mask is not None else None)
        if problem is None:
            raise
        raise TypeError(problem) from None


class ScaledMaskSoftmax(torch.nn.Module):
    """`scaled_mask_softmax` as a layer: `ScaledMaskSoftmax(scale, is_causal)(x, mask)`."""

    def __init__(self, scale=1.0, is_causal=False, causal_variant="upper_left"):
        super().__init__()
        _check_options(scale, is_causal, causal_variant)
        self.scale = float(scale)
        self.is_causal = is_causal
        self.causal_variant = causal_variant

    def forward(self, x, mask=None):
        return scaled_mask_softmax(x, mask, self.scale, self.is_causal, self.causal_variant)

    def extra_repr(self):
        return f"scale={self.scale}, is_causal={self.is_causal}, causal_variant={self.causal_variant!r}"


def _broadcasts_to(shape, target):
    return len(shape) <= len(target) and all(size in (1, full) for size, full in zip(reversed(shape), reversed(target)))


# The fake kernels run for real while torch.compile and torch.export trace. They make the operators' shape checks
# (csrc/binding.h), so that a call that would fail is refused when it is traced, not when the traced graph runs;
# and where the first call of a process is compiled, they load (or build) the CUDA kernels before the graph calls
# them.
@torch.library.register_fake("scaled_mask_softmax::forward")
def _forward_fake(x, mask, scale, is_causal, causal_variant):
    if mask is not None and not _broadcasts_to(mask.shape, x.shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to x of shape {tuple(x.shape)}")
    if x.is_cuda:
        _build.load_cuda_kernels()
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("scaled_mask_softmax::backward")
def _backward_fake(y, dy, scale, is_causal=False, causal_variant="upper_left"):
    if dy.shape != y.shape:
        raise RuntimeError(f"dy must have y's shape {tuple(y.shape)}, got {tuple(dy.shape)}")
    if y.is_cuda:
        _build.load_cuda_kernels()
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


@torch.library.register_fake("scaled_mask_softmax::backward_with_bias_grad")
def _backward_with_bias_grad_fake(y, dy, scale, is_causal, causal_variant, bias_rows):
    dx = _backward_fake(y, dy, scale, is_causal, causal_variant)
    rows = y.numel() // y.shape[-1] if y.shape[-1] else 0
    if bias_rows < 1 or rows % bias_rows:
        raise ValueError(f"bias_rows must be a positive divisor of y's {rows} rows, got {bias_rows}")
    compute_type = torch.float64 if y.dtype == torch.float64 else torch.float32
    return dx, y.new_empty((bias_rows, y.shape[-1]), dtype=compute_type)
