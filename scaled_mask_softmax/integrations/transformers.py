"""Hugging Face transformers models with their attention softmax run by the fused operator.

    from scaled_mask_softmax.integrations.transformers import check, register
    model = check(AutoModelForCausalLM.from_pretrained(path, attn_implementation=register()))

transformers is imported only when `register` is called, so the package does not depend on it.
"""
import torch

from ..attention import attention_probabilities, repeat_heads

# Inputs some models pass that change the scores beyond scale and mask (or, for sparse attention, which keys a query
# sees); ignoring them would be silently wrong.
UNSUPPORTED_INPUTS = ("softcap", "s_aux", "position_bias", "indices", "block_indices")


def boolean_mask(q_length, kv_length, allow_is_causal_skip=True, **kwargs):
    """transformers' SDPA mask: bool `[B, 1, Sq, Sk]` (True = attend), or None for plain causal attention.

    None means causal aligned lower-right to `attention_forward`. transformers also skips the mask for a static
    cache's prefill (Sq > 1 queries before Sk > Sq mostly empty slots), where the causal mask it stands for is
    aligned upper-left; that mask is built instead.
    """
    from transformers.masking_utils import sdpa_mask

    lower_right_is_exact = q_length == 1 or q_length == kv_length
    return sdpa_mask(q_length=q_length, kv_length=kv_length,
                     allow_is_causal_skip=allow_is_causal_skip and lower_right_is_exact, **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function interface: `(output [B, Sq, H, D], probabilities [B, H, Sq, Sk])`.

    query: `[B, H, Sq, D]`; key, value: `[B, H_kv, Sk, D]` (grouped-query heads when H_kv < H).
    attention_mask: bool (True = attend) or additive float, broadcastable to `[B, H, Sq, Sk]`; None means
        causal (lower-right, right for a KV cache) for a causal module, no mask otherwise.
    """
    unsupported = [name for name in UNSUPPORTED_INPUTS if kwargs.get(name) is not None]
    if unsupported:
        raise NotImplementedError(f"the scaled_mask_softmax attention does not support {', '.join(unsupported)}")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # A mask from transformers already holds the causal pattern.
    causal = is_causal and attention_mask is None
    probabilities = attention_probabilities(query, key, attention_mask, is_causal=causal, scale=scaling)
    if module.training and dropout > 0:
        probabilities = torch.nn.functional.dropout(probabilities, p=dropout)
    output = probabilities @ repeat_heads(value, query.shape[1])
    return output.transpose(1, 2).contiguous(), probabilities


def check(model):
    """`model`, where it computes attention through transformers' attention interface; else NotImplementedError.
    transformers takes register()'s name for any model, and one that computes attention itself (Bloom, CodeGen, MPT,
    ...) would build its masks with this package's mask function, bool where it adds them to its scores."""
    if not type(model).is_backend_compatible():
        raise NotImplementedError(f"{type(model).__name__} computes attention itself, not through transformers' "
                                  "attention interface, so the scaled_mask_softmax attention cannot run it")
    return model


def register(name="scaled_mask_softmax"):
    """Registers the attention function and its mask under `name`; returns `name` for `attn_implementation`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    # Without a mask function under the same name, transformers passes no mask at all, dropping padding.
    AttentionMaskInterface.register(name, boolean_mask)
    return name
