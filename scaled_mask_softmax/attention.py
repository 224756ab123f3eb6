"""Scaled dot-product attention whose softmax is the fused operator, with grouped-query heads."""
import math

import torch

from .ops import X_DTYPES, _not_dense, scaled_mask_softmax


def _check_tensor(name, tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    problem = _not_dense(name, tensor)
    if problem:
        raise TypeError(problem)
    if tensor.dim() != 4:
        raise ValueError(f"{name} must be 4-D [B, H, S, D], got shape {tuple(tensor.shape)}")


def _check_same_dtype_and_device(name, tensor, q):
    if tensor.dtype != q.dtype:
        raise TypeError(f"{name} must have q's dtype ({q.dtype}), got {tensor.dtype}")
    if tensor.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {tensor.device}")


def _check_query_key(q, k, mask):
    _check_tensor("q", q)
    _check_tensor("k", k)
    if q.dtype not in X_DTYPES:
        raise TypeError(f"q must be float16, bfloat16, float32 or float64, got {q.dtype}")
    _check_same_dtype_and_device("k", k, q)
    batch, heads, queries, head_dim = q.shape
    if k.shape[0] != batch or k.shape[-1] != head_dim:
        raise ValueError(f"k must be [B={batch}, H_kv, Sk, D={head_dim}] to match q, got shape {tuple(k.shape)}")
    if k.shape[1] == 0 or heads % k.shape[1] != 0:
        raise ValueError(f"k's {k.shape[1]} heads must divide q's {heads} heads (grouped-query attention)")
    if isinstance(mask, torch.Tensor):
        scores_shape = torch.Size((batch, heads, queries, k.shape[2]))
        try:
            broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
        except RuntimeError:
            broadcast = None
        if broadcast != scores_shape:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores "
                             f"[B, H, Sq, Sk] = {tuple(scores_shape)}")


def _check_value(q, k, v):
    _check_tensor("v", v)
    _check_same_dtype_and_device("v", v, q)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be [B, H_kv, Sk, Dv] with [B, H_kv, Sk] = {tuple(k.shape[:3])} as in k, "
                         f"got shape {tuple(v.shape)}")


def repeat_heads(kv, heads):
    """`[B, H_kv, S, D]` -> `[B, heads, S, D]`, each key/value head shared by `heads // H_kv` consecutive heads."""
    batch, kv_heads, length, head_dim = kv.shape
    if kv_heads == heads:
        return kv
    groups = heads // kv_heads
    return kv[:, :, None].expand(batch, kv_heads, groups, length, head_dim).reshape(batch, heads, length, head_dim)


def _probabilities(q, k, mask, is_causal, scale, causal_variant):
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ repeat_heads(k, q.shape[1]).transpose(-2, -1)
    return scaled_mask_softmax(scores, mask, scale, is_causal, causal_variant)


def attention_probabilities(q, k, mask=None, is_causal=False, scale=None, causal_variant="lower_right"):
    """`softmax(q @ k^T * scale + mask)` as `[B, H, Sq, Sk]`: `attention` without the product with v."""
    _check_query_key(q, k, mask)
    return _probabilities(q, k, mask, is_causal, scale, causal_variant)


def attention(q, k, v, mask=None, is_causal=False, scale=None, causal_variant="lower_right"):
    """`softmax(q @ k^T * scale + mask) @ v` with the fused softmax.

    q: `[B, H, Sq, D]`; k, v: `[B, H_kv, Sk, D]` and `[B, H_kv, Sk, Dv]`, where H_kv divides H (grouped-query
        heads: query head h reads key/value head `h // (H // H_kv)`).
    mask: None; bool (True = attend); or floating, added to the scaled scores. It must broadcast to
        `[B, H, Sq, Sk]`.
    is_causal: query i cannot see key j > i + Sk - Sq by default ("lower_right": the last query sees every key, as
        when decoding from a KV cache); with causal_variant="upper_left", j > i, as F.scaled_dot_product_attention's
        is_causal. The two differ only where Sq != Sk.
    scale: defaults to 1 / sqrt(D).
    A query that can see no key gets zeros.
    """
    _check_query_key(q, k, mask)
    _check_value(q, k, v)
    return _probabilities(q, k, mask, is_causal, scale, causal_variant) @ repeat_heads(v, q.shape[1])
