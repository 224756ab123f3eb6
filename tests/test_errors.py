"""Bad input gets an error that names the argument and says what was expected and what came."""
import math

import numpy as np
import pytest
import torch

import scaled_mask_softmax as sms

X = torch.randn(2, 3, 4, 5)


@pytest.mark.parametrize("call,error,message", [
    (lambda: sms.scaled_mask_softmax([1.0, 2.0]), TypeError, "x must be a torch.Tensor, got list"),
    (lambda: sms.scaled_mask_softmax(torch.ones(3, 4, dtype=torch.int64)), TypeError,
     "x must be float16, bfloat16, float32 or float64, got torch.int64"),
    (lambda: sms.scaled_mask_softmax(torch.ones(3, dtype=torch.complex64)), TypeError, "got torch.complex64"),
    (lambda: sms.scaled_mask_softmax(torch.tensor(1.0)), ValueError, "x must have at least 1 dim"),
    (lambda: sms.scaled_mask_softmax(X.to_sparse()), TypeError,
     "x must be a dense (strided) tensor, got layout torch.sparse_coo"),
    (lambda: sms.scaled_mask_softmax(torch.nested.nested_tensor([X[0], X[1, :2]], layout=torch.jagged)), TypeError,
     "x must be a dense (strided) tensor, got a nested tensor (layout torch.jagged)"),
    (lambda: sms.scaled_mask_softmax(X, torch.zeros(5).to_sparse()), TypeError,
     "mask must be a dense (strided) tensor, got layout torch.sparse_coo"),
    (lambda: sms.scaled_mask_softmax(X, torch.nested.nested_tensor([X[0], X[1]], layout=torch.jagged)), TypeError,
     "mask must be a dense (strided) tensor, got a nested tensor (layout torch.jagged)"),
    (lambda: sms.scaled_mask_softmax(X, torch.ones(5, dtype=torch.int32)), TypeError,
     "mask must be bool (True = attend) or floating (added to the scores), got torch.int32"),
    (lambda: sms.scaled_mask_softmax(X, [0.0] * 5), TypeError, "mask must be None or a torch.Tensor, got list"),
    (lambda: sms.scaled_mask_softmax(X, torch.zeros(2, 1, 1, 4)), ValueError,
     "mask of shape (2, 1, 1, 4) does not broadcast to x of shape (2, 3, 4, 5)"),
    (lambda: sms.scaled_mask_softmax(X, torch.zeros(1, 2, 3, 4, 5)), ValueError,
     "mask of shape (1, 2, 3, 4, 5) does not broadcast to x of shape (2, 3, 4, 5)"),
    (lambda: sms.scaled_mask_softmax(torch.randn(5), is_causal=True), ValueError,
     "is_causal=True needs x with at least 2 dims [..., Sq, Sk], got shape (5,)"),
    (lambda: sms.scaled_mask_softmax(X, is_causal=True, causal_variant="bottom_right"), ValueError,
     "causal_variant must be 'upper_left' or 'lower_right', got 'bottom_right'"),
    (lambda: sms.scaled_mask_softmax(X, scale=math.inf), ValueError, "scale must be finite, got inf"),
    (lambda: sms.scaled_mask_softmax(X, scale=math.nan), ValueError, "scale must be finite, got nan"),
    (lambda: sms.scaled_mask_softmax(X, scale=10**400), ValueError, "scale must be finite, got int beyond a float's"),
    (lambda: sms.scaled_mask_softmax(X, scale=1e39), ValueError,
     "scale must be finite in x's compute type (Float), got 1e+39"),
    (lambda: sms.scaled_mask_softmax(X.half(), scale=-1e39), ValueError,
     "scale must be finite in x's compute type (Float), got -1e+39"),
    (lambda: sms.scaled_mask_softmax(X, scale="0.5"), TypeError, "scale must be a real number, got str"),
    (lambda: sms.scaled_mask_softmax(X, is_causal=1), TypeError, "is_causal must be a bool, got int"),
    (lambda: sms.scaled_mask_softmax(X, is_causal=np.True_), TypeError, "is_causal must be a bool, got numpy.bool"),
    (lambda: sms.ScaledMaskSoftmax(scale=float("inf")), ValueError, "scale must be finite, got inf"),
    (lambda: sms.ScaledMaskSoftmax(causal_variant="lower"), ValueError, "causal_variant must be"),
])
def test_bad_input_names_the_argument(call, error, message):
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mask_on_another_device():
    with pytest.raises(ValueError, match=r"mask must be on x's device \(cuda:0\), got cpu"):
        sms.scaled_mask_softmax(X.cuda(), torch.zeros(5))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sparse_x_on_the_gpu():
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) tensor, got layout torch.sparse_coo"):
        sms.scaled_mask_softmax(X.cuda().to_sparse())


def test_direct_operator_calls_are_checked_too():
    with pytest.raises(RuntimeError, match="causal_variant must be 'upper_left' or 'lower_right'"):
        torch.ops.scaled_mask_softmax.forward(X, None, 1.0, True, "diagonal")
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 4\) does not broadcast to x of shape"):
        torch.ops.scaled_mask_softmax.forward(X, torch.zeros(2, 1, 1, 4), 1.0, False, "upper_left")
    with pytest.raises(RuntimeError, match="dy must have y's shape"):
        torch.ops.scaled_mask_softmax.backward(X, X[0], 1.0)
    for scale in (math.inf, math.nan, 1e39):
        with pytest.raises(ValueError, match=r"scale must be finite in x's compute type \(Float\)"):
            torch.ops.scaled_mask_softmax.forward(X, None, scale, False, "upper_left")
        with pytest.raises(ValueError, match=r"scale must be finite in y's compute type \(Float\)"):
            torch.ops.scaled_mask_softmax.backward(X, X, scale)


class MaskedScores(torch.nn.Module):
    def forward(self, x, mask):
        return sms.scaled_mask_softmax(x, mask, 0.5)


def test_tracing_refuses_what_the_operator_would():
    """torch.export and torch.compile trace through the fake kernels, which make the operator's shape checks: a bad
    mask is refused when traced, not when the exported or compiled graph first runs."""
    graphs = []

    def backend(graph, example_inputs):  # reached only by a trace that succeeded
        graphs.append(graph)
        return graph

    message = r"mask of shape \(5, 5\) does not broadcast to x of shape \(2, 3, 4, 5\)"
    with pytest.raises(Exception, match=message):
        torch.export.export(MaskedScores(), (X, torch.zeros(5, 5)))
    with pytest.raises(Exception, match=message):
        torch.compile(MaskedScores(), fullgraph=True, backend=backend)(X, torch.zeros(5, 5))
    with pytest.raises(Exception, match=r"dy must have y's shape \(2, 3, 4, 5\), got \(3, 4, 5\)"):
        torch.compile(torch.ops.scaled_mask_softmax.backward, fullgraph=True, backend=backend)(X, X[0], 1.0)
    assert graphs == []


def test_fp64_scores_take_any_finite_scale():
    x = torch.tensor([[0.0, 1e-300]], dtype=torch.float64)
    expected = torch.softmax(x * 1e300, dim=-1)
    torch.testing.assert_close(sms.scaled_mask_softmax(x, scale=1e300), expected)


def test_direct_operator_calls_refuse_tangents():
    # The C++ autograd carries no tangents: dropped, they would read as zero. The public function takes them.
    import torch.autograd.forward_ad as forward_ad

    with forward_ad.dual_level():
        dual = forward_ad.make_dual(X, torch.ones_like(X))
        with pytest.raises(RuntimeError, match="scaled_mask_softmax.forward does not take forward-mode tangents"):
            torch.ops.scaled_mask_softmax.forward(dual, None, 1.0, False, "upper_left")
        with pytest.raises(RuntimeError, match="scaled_mask_softmax.backward does not take forward-mode tangents"):
            torch.ops.scaled_mask_softmax.backward(X, dual, 1.0)
        assert forward_ad.unpack_dual(sms.scaled_mask_softmax(dual)).tangent is not None
