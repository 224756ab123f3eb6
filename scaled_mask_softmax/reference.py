"""The operator's contract written in plain PyTorch, in float64 by default.

Tests, `check` and the benchmarks compare the kernels against this function; the eager composite users
write by hand (`eager_composite`) is kept beside it as the benchmark's baseline.
"""
import torch


def causal_visible(rows: int, cols: int, causal_variant: str, device=None) -> torch.Tensor:
    """Bool `[rows, cols]`: True where query `i` may see key `j`."""
    offset = 0 if causal_variant == "upper_left" else cols - rows
    query = torch.arange(rows, device=device).unsqueeze(-1)
    key = torch.arange(cols, device=device)
    return key <= query + offset


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = attend) as 0 / -inf; a floating mask as it is, in `dtype`."""
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        return torch.where(mask, zero, float("-inf"))
    return mask.to(dtype)


def scaled_mask_softmax_reference(x, mask=None, scale=1.0, is_causal=False, causal_variant="upper_left",
                                  dtype=torch.float64):
    """`softmax(x * scale + mask)` over the last dim, computed in `dtype`; fully masked rows give zeros."""
    scores = x.to(dtype) * scale
    if mask is not None:
        scores = scores + additive_mask(mask, dtype)
    if is_causal:
        visible = causal_visible(x.shape[-2], x.shape[-1], causal_variant, x.device)
        scores = scores.masked_fill(~visible, float("-inf"))
    # Softmax of an all -inf row is NaN (and so would its gradient be): such rows go through as zeros.
    fully_masked = (scores == float("-inf")).all(dim=-1, keepdim=True)
    y = torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1)
    return y.masked_fill(fully_masked, 0.0)


def eager_composite(x, mask=None, scale=1.0, is_causal=False):
    """What users write by hand: scale, add the mask, mask the future, softmax (several kernels)."""
    scores = x * scale
    if mask is not None:
        scores = scores + mask
    if is_causal:
        visible = causal_visible(x.shape[-2], x.shape[-1], "upper_left", x.device)
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1)
