// The forward's autograd kernel, for every device: the graph node saves y alone, and its backward is the
// backward op (a learnable floating mask also gets the score gradient, summed over its broadcast dims); the
// forward-mode tangent comes from the backward op too.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

namespace sms {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_forward_below_autograd(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale,
                                       bool is_causal, c10::string_view causal_variant) {
  static const auto forward_op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("scaled_mask_softmax::forward", "")
          .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double, bool, c10::string_view)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return forward_op.call(x, mask, scale, is_causal, causal_variant);
}

at::Tensor call_backward(const at::Tensor& y, const at::Tensor& dy, double scale, bool is_causal,
                         c10::string_view causal_variant) {
  static const auto backward_op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("scaled_mask_softmax::backward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double, bool, c10::string_view)>();
  return backward_op.call(y, dy, scale, is_causal, causal_variant);
}

class ScaledMaskSoftmaxFunction : public torch::autograd::Function<ScaledMaskSoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& mask,
                            double scale, bool is_causal, c10::string_view causal_variant) {
    at::Tensor y = call_forward_below_autograd(x, mask, scale, is_causal, causal_variant);
    // dx = scale * y * (dy - sum(dy * y)) needs y alone. Each saved_data entry is a map insert on every call
    // that builds a graph, so only what the backward reads is kept: the causal variant only when causal, the
    // mask's shape and dtype only when the mask is learnable.
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    if (is_causal) ctx->saved_data["causal_variant"] = std::string(causal_variant);
    if (mask.has_value() && mask->requires_grad()) {
      ctx->saved_data["mask_sizes"] = mask->sym_sizes();
      ctx->saved_data["mask_dtype"] = mask->scalar_type();
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const at::Tensor& dy = grad_outputs[0];
    // The backward op has no derivative of its own: a graph built through it would give zero second derivatives.
    TORCH_CHECK(!at::GradMode::is_enabled() || !(y.requires_grad() || dy.requires_grad()),
                "scaled_mask_softmax has no double backward: backward(create_graph=True) and higher-order "
                "gradients through it are not supported");
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool is_causal = ctx->saved_data.count("causal_variant") > 0;
    const c10::string_view causal_variant =
        is_causal ? ctx->saved_data["causal_variant"].toStringView() : c10::string_view("upper_left");
    // The graph's inputs are x, then the mask when one was given.
    const bool needs_x = ctx->needs_input_grad(0);
    const bool needs_mask = ctx->saved_data.count("mask_sizes") > 0 && ctx->needs_input_grad(1);
    at::Tensor dx, dmask;
    if (needs_mask) {
      // d(loss)/d(scores) serves both: dx is it times scale, a learnable bias gets it summed over broadcast dims.
      at::Tensor grad_scores = call_backward(y, dy, 1.0, is_causal, causal_variant);
      const auto mask_dtype = ctx->saved_data["mask_dtype"].toScalarType();
      const auto accumulate = mask_dtype == at::kDouble ? at::kDouble : at::kFloat;
      dmask = at::sum_to(grad_scores.to(accumulate), ctx->saved_data["mask_sizes"].toSymIntVector()).to(mask_dtype);
      if (needs_x) dx = grad_scores * scale;
    } else if (needs_x) {
      dx = call_backward(y, dy, scale, is_causal, causal_variant);
    }
    return {dx, dmask, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Forward mode (torch.func.jvp, torch.autograd.forward_ad): the tangent of y = softmax(s) is
// y * (ds - sum(y * ds)), the backward op's formula with ds = dx * scale + dmask in place of dy.
at::Tensor score_tangent(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale) {
  const at::Tensor x_tangent = x._fw_grad(/*level=*/0);
  const at::Tensor mask_tangent = mask.has_value() ? mask->_fw_grad(/*level=*/0) : at::Tensor();
  if (!mask_tangent.defined()) return x_tangent.defined() ? x_tangent * scale : at::Tensor();
  return x_tangent.defined() ? x_tangent * scale + mask_tangent : mask_tangent.expand_as(x);
}

at::Tensor forward_autograd(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale,
                            bool is_causal, c10::string_view causal_variant) {
  const bool builds_graph =
      at::GradMode::is_enabled() && (x.requires_grad() || (mask.has_value() && mask->requires_grad()));
  const at::Tensor tangent = score_tangent(x, mask, scale);
  // Function::apply allocates a graph node even when nothing requires grad; a plain call skips that. It also
  // refuses inputs that carry tangents, so it gets their primals, which keep the graph.
  at::Tensor y;
  if (!builds_graph) {
    y = call_forward_below_autograd(x, mask, scale, is_causal, causal_variant);
  } else if (!tangent.defined()) {
    y = ScaledMaskSoftmaxFunction::apply(x, mask, scale, is_causal, causal_variant);
  } else {
    const std::optional<at::Tensor> mask_primal =
        mask.has_value() ? std::optional<at::Tensor>(mask->_fw_primal(/*level=*/0)) : std::nullopt;
    y = ScaledMaskSoftmaxFunction::apply(x._fw_primal(/*level=*/0), mask_primal, scale, is_causal, causal_variant);
  }
  if (tangent.defined()) {
    y._set_fw_grad(call_backward(y._fw_primal(/*level=*/0), tangent, 1.0, is_causal, causal_variant),
                   /*level=*/0, /*is_inplace_op=*/false);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(scaled_mask_softmax, Autograd, m) { m.impl("forward", &forward_autograd); }

}  // namespace sms
