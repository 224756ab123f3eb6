"""One fused PyTorch operator for attention's softmax: y = softmax(x * scale + mask) over the last dim,
with an optional causal mask, forward and backward, on CUDA GPUs and on CPU."""
from . import _build  # noqa: F401  (registers torch.ops.scaled_mask_softmax.*)
from .attention import attention
from .ops import ScaledMaskSoftmax, scaled_mask_softmax
from .reference import scaled_mask_softmax_reference

__version__ = "0.1.0"
__all__ = ["ScaledMaskSoftmax", "attention", "scaled_mask_softmax", "scaled_mask_softmax_reference"]
