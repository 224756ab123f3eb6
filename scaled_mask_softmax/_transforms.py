"""Forward mode and torch.func: batching rules for both operators, and the autograd they take in forward mode.

The operators' own autograd (csrc/autograd.cpp) is C++, which carries no tangents and which torch.func.grad, vjp,
jacrev and hessian cannot trace. Under a torch.func transform, or while a forward-mode level is open
(torch.autograd.forward_ad), the public function goes through `TransformableSoftmax` instead. Its reverse-mode
formulas are those of csrc/autograd.cpp.
"""
import torch

from .reference import causal_visible

_forward_op = torch.ops.scaled_mask_softmax.forward.default
_backward_op = torch.ops.scaled_mask_softmax.backward.default
# torch.library.register_vmap is new in torch 2.5, whose version trips an internal assert of functorch where the
# rules run under nested transforms (torch.func.hessian). Without the rules, vmap runs the operators once per sample
# (correct, slower) and says so.
BATCHING_RULES = torch.__version__ >= (2, 6)
_register_vmap = torch.library.register_vmap if BATCHING_RULES else lambda name: lambda rule: rule


def _batch_first(tensor, batch_dim, batch_size):
    """`tensor` with the vmapped dim first; an unbatched tensor gets a stride-0 one (the kernels read strides)."""
    if batch_dim is None:
        return tensor.expand(batch_size, *tensor.shape)
    return tensor.movedim(batch_dim, 0)


@_register_vmap("scaled_mask_softmax::forward")
def _forward_vmap(info, in_dims, x, mask, scale, is_causal, causal_variant):
    x_dim, mask_dim = in_dims[:2]
    x = _batch_first(x, x_dim, info.batch_size)
    if mask is not None and mask_dim is not None:
        # The mask broadcasts to x from the right: its own dims go last, after ones where x has more.
        mask = mask.movedim(mask_dim, 0)
        mask = mask.reshape(mask.shape[:1] + (1,) * (x.dim() - mask.dim()) + mask.shape[1:])
    return _forward_op(x, mask, scale, is_causal, causal_variant), 0


@_register_vmap("scaled_mask_softmax::backward")
def _backward_vmap(info, in_dims, y, dy, scale, is_causal=False, causal_variant="upper_left"):
    y, dy = (_batch_first(t, dim, info.batch_size) for t, dim in zip((y, dy), in_dims[:2]))
    return _backward_op(y, dy, scale, is_causal, causal_variant), 0


def _visible_part(t, is_causal, causal_variant):
    """The backward op reads only a causal row's visible keys: what lies past them is zeroed."""
    if not is_causal:
        return t
    return torch.where(causal_visible(t.shape[-2], t.shape[-1], causal_variant, t.device), t, 0)


def _row_sum(a, b):
    return (a * b).sum(-1, keepdim=True)


class TransformableBackward(torch.autograd.Function):
    """dx = scale * y * (dy - r), r = sum(dy * y) over a row: linear in dy (the op itself is its adjoint there);
    in y, a perturbation p moves it by scale * (p * (dy - r) - y * sum(p * dy))."""

    generate_vmap_rule = True

    @staticmethod
    def forward(y, dy, scale, is_causal, causal_variant):
        return _backward_op(y, dy, scale, is_causal, causal_variant)

    @staticmethod
    def setup_context(ctx, inputs, output):
        y, dy, *ctx.options = inputs
        ctx.save_for_backward(y, dy)
        ctx.save_for_forward(y, dy)

    @staticmethod
    def backward(ctx, grad_dx):
        y, dy = ctx.saved_tensors
        scale, is_causal, causal_variant = ctx.options
        grad_y = grad_dy = None
        if ctx.needs_input_grad[0]:
            g, dy = (_visible_part(t, is_causal, causal_variant) for t in (grad_dx, dy))
            grad_y = scale * (g * (dy - _row_sum(dy, y)) - dy * _row_sum(g, y))
        if ctx.needs_input_grad[1]:
            grad_dy = TransformableBackward.apply(y, grad_dx, *ctx.options)
        return grad_y, grad_dy, None, None, None

    @staticmethod
    def jvp(ctx, y_tangent, dy_tangent, *_):
        y, dy = ctx.saved_tensors
        scale, is_causal, causal_variant = ctx.options
        tangent = 0
        if dy_tangent is not None:
            tangent = TransformableBackward.apply(y, dy_tangent, *ctx.options)
        if y_tangent is not None:
            p, dy = (_visible_part(t, is_causal, causal_variant) for t in (y_tangent, dy))
            tangent = tangent + scale * (p * (dy - _row_sum(dy, y)) - y * _row_sum(p, dy))
        return tangent


class TransformableSoftmax(torch.autograd.Function):
    """The forward, its gradient (a learnable floating mask's summed over its broadcast dims) and its tangent."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, mask, scale, is_causal, causal_variant):
        return _forward_op(x, mask, scale, is_causal, causal_variant)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, mask, *ctx.options = inputs
        ctx.mask_form = None if mask is None else (mask.shape, mask.dtype)
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        scale, is_causal, causal_variant = ctx.options
        needs_x, needs_mask = ctx.needs_input_grad[:2]
        dx = dmask = None
        if needs_mask:
            # As csrc/autograd.cpp: the bias's terms formed in the type of their sum.
            mask_shape, mask_dtype = ctx.mask_form
            accumulate = torch.promote_types(torch.promote_types(mask_dtype, y.dtype), torch.float32)
            grad_scores = TransformableBackward.apply(y.to(accumulate), dy.to(accumulate), 1.0, is_causal,
                                                      causal_variant)
            dmask = grad_scores.sum_to_size(mask_shape).to(mask_dtype)
        if needs_x:
            dx = TransformableBackward.apply(y, dy, scale, is_causal, causal_variant)
        return dx, dmask, None, None, None

    @staticmethod
    def jvp(ctx, x_tangent, mask_tangent, *_):
        (y,) = ctx.saved_tensors
        scale, is_causal, causal_variant = ctx.options
        score_tangent = 0 if x_tangent is None else x_tangent * scale
        if mask_tangent is not None:
            score_tangent = (score_tangent + mask_tangent).expand_as(y)
        return TransformableBackward.apply(y, score_tangent, 1.0, is_causal, causal_variant)
