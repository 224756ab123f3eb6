// The operators' reverse-mode autograd kernels, for every device. The forward's graph node saves y alone, and its
// backward is the backward op (a learnable floating mask also gets the score gradient, summed over its broadcast
// dims: by backward_with_bias_grad, with dx, where it repeats along leading dims); the backward op has a derivative
// of its own, so second and higher derivatives work.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <tuple>

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

std::tuple<at::Tensor, at::Tensor> call_backward_with_bias_grad(const at::Tensor& y, const at::Tensor& dy, double scale,
                                                                 bool is_causal, c10::string_view causal_variant,
                                                                 const c10::SymInt& bias_rows) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("scaled_mask_softmax::backward_with_bias_grad", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double,
                                                                       bool, c10::string_view, c10::SymInt)>();
  return op.call(y, dy, scale, is_causal, causal_variant, bias_rows);
}

at::Tensor call_backward_below_autograd(const at::Tensor& y, const at::Tensor& dy, double scale, bool is_causal,
                                        c10::string_view causal_variant) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_backward(y, dy, scale, is_causal, causal_variant);
}

// Each saved_data entry is a map insert on every call that builds a graph, so the causal variant is kept only
// when causal.
void save_options(AutogradContext* ctx, double scale, bool is_causal, c10::string_view causal_variant) {
  ctx->saved_data["scale"] = scale;
  if (is_causal) ctx->saved_data["causal_variant"] = std::string(causal_variant);
}

std::tuple<double, bool, c10::string_view> saved_options(AutogradContext* ctx) {
  const bool is_causal = ctx->saved_data.count("causal_variant") > 0;
  return {ctx->saved_data["scale"].toDouble(), is_causal,
          is_causal ? ctx->saved_data["causal_variant"].toStringView() : c10::string_view("upper_left")};
}

// A C++ autograd::Function cannot carry tangents. The public Python function takes a Python autograd.Function
// wherever forward mode is on (_transforms.py); a direct call that got tangents would drop them silently.
void check_no_tangent(const at::Tensor& t, const char* op) {
  TORCH_CHECK(!t._fw_grad(/*level=*/0).defined(), "torch.ops.scaled_mask_softmax.", op,
              " does not take forward-mode tangents (dual tensors); call scaled_mask_softmax.scaled_mask_softmax, "
              "which does");
}

// The backward op reads only a causal row's visible keys, so whatever lies past them has no effect on its result.
at::Tensor visible_part(const at::Tensor& t, bool is_causal, c10::string_view causal_variant) {
  if (!is_causal) return t;
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const at::Tensor visible = at::ones({rows, cols}, t.options().dtype(at::kBool))
                                 .tril(causal_variant == "lower_right" ? cols - rows : 0);
  return at::where(visible, t, at::zeros({}, t.options()));
}

// The rows of a mask of `mask_sizes` that broadcasts to scores of `sizes` over leading dims alone, with a value for
// every key: row r of the scores then took the mask's row r % (that count). 0 where it broadcasts otherwise.
c10::SymInt leading_broadcast_rows(c10::SymIntArrayRef mask_sizes, c10::SymIntArrayRef sizes) {
  if (mask_sizes.empty() || mask_sizes.back() != sizes.back()) return 0;
  const int64_t leading = static_cast<int64_t>(sizes.size() - mask_sizes.size());
  c10::SymInt rows = 1;
  bool broadcast = false;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
    const c10::SymInt size = d >= leading ? mask_sizes[d - leading] : c10::SymInt(1);
    if (size != sizes[d]) {
      broadcast = true;
    } else if (broadcast && size != 1) {
      return 0;
    } else {
      rows *= size;
    }
  }
  return rows;
}

at::Tensor row_sum(const at::Tensor& a, const at::Tensor& b) { return (a * b).sum(-1, /*keepdim=*/true); }

// dx = scale * y * (dy - r), r = sum(dy * y) over a row. It is linear in dy, where the backward op is its own
// adjoint; the adjoint of its derivative in y takes a gradient g of dx to scale * (g * (dy - r) - dy * sum(g * y)).
class ScaledMaskSoftmaxBackwardFunction : public torch::autograd::Function<ScaledMaskSoftmaxBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& dy, double scale,
                            bool is_causal, c10::string_view causal_variant) {
    ctx->save_for_backward({y, dy});
    save_options(ctx, scale, is_causal, causal_variant);
    return call_backward_below_autograd(y, dy, scale, is_causal, causal_variant);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &y = saved[0], &grad_dx = grad_outputs[0];
    const auto [scale, is_causal, causal_variant] = saved_options(ctx);
    at::Tensor grad_y, grad_dy;
    if (ctx->needs_input_grad(0)) {
      const at::Tensor g = visible_part(grad_dx, is_causal, causal_variant);
      const at::Tensor dy = visible_part(saved[1], is_causal, causal_variant);
      grad_y = scale * (g * (dy - row_sum(dy, y)) - dy * row_sum(g, y));
    }
    if (ctx->needs_input_grad(1)) grad_dy = call_backward(y, grad_dx, scale, is_causal, causal_variant);
    return {grad_y, grad_dy, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor backward_autograd(const at::Tensor& y, const at::Tensor& dy, double scale, bool is_causal,
                             c10::string_view causal_variant) {
  check_no_tangent(y, "backward");
  check_no_tangent(dy, "backward");
  // Function::apply allocates a graph node even when nothing requires grad; a plain call skips that.
  if (!at::GradMode::is_enabled() || !(y.requires_grad() || dy.requires_grad())) {
    return call_backward_below_autograd(y, dy, scale, is_causal, causal_variant);
  }
  return ScaledMaskSoftmaxBackwardFunction::apply(y, dy, scale, is_causal, causal_variant);
}

class ScaledMaskSoftmaxFunction : public torch::autograd::Function<ScaledMaskSoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& mask,
                            double scale, bool is_causal, c10::string_view causal_variant) {
    at::Tensor y = call_forward_below_autograd(x, mask, scale, is_causal, causal_variant);
    // dx = scale * y * (dy - sum(dy * y)) needs y alone; the mask's shape and dtype are kept only when the mask
    // is learnable.
    ctx->save_for_backward({y});
    save_options(ctx, scale, is_causal, causal_variant);
    if (mask.has_value() && mask->requires_grad()) {
      ctx->saved_data["mask_sizes"] = mask->sym_sizes();
      ctx->saved_data["mask_dtype"] = mask->scalar_type();
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // y, saved as this node's output, leads a second derivative back through this node.
    const at::Tensor y = ctx->get_saved_variables()[0];
    const at::Tensor& dy = grad_outputs[0];
    const auto [scale, is_causal, causal_variant] = saved_options(ctx);
    // The graph's inputs are x, then the mask when one was given.
    const bool needs_x = ctx->needs_input_grad(0);
    const bool needs_mask = ctx->saved_data.count("mask_sizes") > 0 && ctx->needs_input_grad(1);
    at::Tensor dx, dmask;
    if (needs_mask) {
      // A learnable bias gets d(loss)/d(scores) summed over its broadcast dims, each term formed in the type of the
      // sum: formed in a 16-bit x's dtype, the terms of a small gradient would round, many to zero, before it.
      const auto mask_dtype = ctx->saved_data["mask_dtype"].toScalarType();
      const auto mask_sizes = ctx->saved_data["mask_sizes"].toSymIntVector();
      const auto accumulate = at::promote_types(at::promote_types(mask_dtype, y.scalar_type()), at::kFloat);
      const c10::SymInt bias_rows = leading_broadcast_rows(mask_sizes, y.sym_sizes());
      // Where the bias repeats along leading dims and its gradient is summed in y's compute type, one pass over y
      // and dy gives dx and the sums. That op has no derivative of its own: where one is being formed (grad mode
      // on, for a second derivative), the composite below runs.
      if (bias_rows != 0 && accumulate == at::toOpMathType(y.scalar_type()) && !at::GradMode::is_enabled()) {
        auto [fused_dx, bias_grad] = call_backward_with_bias_grad(y, dy, scale, is_causal, causal_variant, bias_rows);
        return {needs_x ? fused_dx : at::Tensor(), bias_grad.view_symint(mask_sizes).to(mask_dtype), at::Tensor(),
                at::Tensor(), at::Tensor()};
      }
      const at::Tensor grad_scores =
          call_backward(y.to(accumulate), dy.to(accumulate), 1.0, is_causal, causal_variant);
      dmask = at::sum_to(grad_scores, mask_sizes).to(mask_dtype);
    }
    if (needs_x) dx = call_backward(y, dy, scale, is_causal, causal_variant);
    return {dx, dmask, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor forward_autograd(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale,
                            bool is_causal, c10::string_view causal_variant) {
  check_no_tangent(x, "forward");
  if (mask.has_value()) check_no_tangent(*mask, "forward");
  const bool builds_graph =
      at::GradMode::is_enabled() && (x.requires_grad() || (mask.has_value() && mask->requires_grad()));
  if (!builds_graph) return call_forward_below_autograd(x, mask, scale, is_causal, causal_variant);
  return ScaledMaskSoftmaxFunction::apply(x, mask, scale, is_causal, causal_variant);
}

}  // namespace

TORCH_LIBRARY_IMPL(scaled_mask_softmax, Autograd, m) {
  m.impl("forward", &forward_autograd);
  m.impl("backward", &backward_autograd);
}

}  // namespace sms
