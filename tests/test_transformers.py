"""`attention` against a float64 reference, and a small Llama run through the transformers integration
against the same model with transformers' eager attention."""
import pytest
import torch

from scaled_mask_softmax import attention, scaled_mask_softmax_reference
from scaled_mask_softmax.integrations import transformers as integration
from conftest import DEVICES

transformers = pytest.importorskip("transformers")

# (dtype, atol, rtol) against the float64 reference.
TOLERANCES = [(torch.float32, 2e-5, 1e-5), (torch.float64, 1e-12, 1e-12)]


def reference_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """Plain float64 attention: heads repeated, the contract's softmax (causal lower-right)."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probabilities = scaled_mask_softmax_reference(q @ k.transpose(-2, -1), mask, scale, is_causal, "lower_right")
    return probabilities @ v


def left_padding_mask(batch, keys, device):
    """Bool `[B, 1, 1, Sk]`: batch item b has its first b keys padded."""
    mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool, device=device)
    for b in range(batch):
        mask[b, ..., :b] = False
    return mask


# (heads, kv_heads, queries, keys, mask, is_causal): MHA and GQA, prefill (Sq == Sk), chunked prefill and
# decoding with a KV cache (Sq < Sk), every mask form.
ATTENTION_CASES = [
    (4, 4, 7, 7, None, False),
    (4, 4, 7, 7, None, True),
    (4, 2, 7, 7, None, True),
    (4, 1, 3, 9, None, True),
    (4, 2, 1, 9, None, True),
    (4, 2, 5, 9, "padding", True),
    (4, 2, 5, 9, "padding", False),
    (4, 2, 7, 7, "float", False),
    (4, 2, 7, 7, "float", True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, atol, rtol", TOLERANCES)
@pytest.mark.parametrize("heads, kv_heads, queries, keys, mask_kind, is_causal", ATTENTION_CASES)
def test_attention_matches_reference(device, dtype, atol, rtol, heads, kv_heads, queries, keys, mask_kind,
                                     is_causal):
    torch.manual_seed(0)
    batch, head_dim = 3, 16
    q = torch.randn(batch, heads, queries, head_dim, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(batch, kv_heads, keys, head_dim, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(batch, kv_heads, keys, head_dim, dtype=dtype, device=device, requires_grad=True)
    mask = None
    if mask_kind == "padding":
        mask = left_padding_mask(batch, keys, device)
    elif mask_kind == "float":
        mask = torch.randn(batch, 1, queries, keys, dtype=dtype, device=device)
    out = attention(q, k, v, mask, is_causal)
    expected = reference_attention(q, k, v, mask, is_causal)
    torch.testing.assert_close(out, expected.to(dtype), atol=atol, rtol=rtol)

    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out.double())
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad.to(dtype), atol=10 * atol, rtol=10 * rtol)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_with_kv_cache_matches_full_causal_attention(device):
    """The last Sq queries against all Sk keys see what they saw in the full causal (Sk x Sk) attention."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 9, 8, dtype=torch.float64, device=device)
    k, v = (torch.randn(2, 2, 9, 8, dtype=torch.float64, device=device) for _ in range(2))
    full = attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attention(q[:, :, -3:], k, v, is_causal=True), full[:, :, -3:])


@pytest.mark.parametrize("device", DEVICES)
def test_attention_upper_left_is_sdpa_is_causal(device):
    """causal_variant="upper_left" gives F.scaled_dot_product_attention's is_causal, where Sq != Sk."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, device=device)
    k, v = (torch.randn(2, 4, 9, 8, dtype=torch.float64, device=device) for _ in range(2))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attention(q, k, v, is_causal=True, causal_variant="upper_left"), expected)
    assert not torch.allclose(attention(q, k, v, is_causal=True), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_fully_masked_query_gives_zeros(device):
    q, k, v = (torch.randn(1, 2, 4, 8, device=device) for _ in range(3))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool, device=device)
    mask[..., 2, :] = False
    out = attention(q, k, v, mask)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name, value, error, message", [
    ("q", torch.randn(4, 5, 8), ValueError, "q must be 4-D"),
    ("k", "keys", TypeError, "k must be a torch.Tensor"),
    ("q", torch.nested.nested_tensor([torch.randn(4, 5, 8)] * 2, layout=torch.jagged), TypeError,
     r"q must be a dense \(strided\) tensor, got a nested tensor"),
    ("v", torch.randn(2, 2, 6, 8).to_sparse(), TypeError, r"v must be a dense \(strided\) tensor, got layout"),
    ("mask", torch.zeros(6).to_sparse(), TypeError, r"mask must be a dense \(strided\) tensor, got layout"),
    ("q", torch.ones(2, 4, 5, 8, dtype=torch.int64), TypeError, "q must be float16"),
    ("k", torch.randn(2, 2, 6, 8, dtype=torch.float64), TypeError, "k must have q's dtype"),
    ("k", torch.randn(2, 2, 6, 4), ValueError, r"k must be \[B=2, H_kv, Sk, D=8\]"),
    ("k", torch.randn(2, 3, 6, 8), ValueError, "k's 3 heads must divide q's 4 heads"),
    ("v", torch.randn(2, 2, 5, 8), ValueError, r"v must be \[B, H_kv, Sk, Dv\]"),
    ("mask", torch.ones(2, 1, 5, 7, dtype=torch.bool), ValueError, "does not broadcast to the scores"),
    ("mask", torch.ones(2, 1, 5, 6, dtype=torch.int64), TypeError, "mask must be bool"),
])
def test_attention_argument_errors(name, value, error, message):
    arguments = dict(q=torch.randn(2, 4, 5, 8), k=torch.randn(2, 2, 6, 8), v=torch.randn(2, 2, 6, 8), mask=None)
    arguments[name] = value
    with pytest.raises(error, match=message):
        attention(**arguments)


# Llama with grouped-query heads (4 query heads over 2 key/value heads), random weights.
LLAMA_CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
PROMPT_LENGTH = 10


def small_llama(device, dtype, **config):
    torch.manual_seed(0)
    llama_config = transformers.LlamaConfig(**LLAMA_CONFIG, **config, attn_implementation="eager")
    return transformers.LlamaForCausalLM(llama_config).to(device, dtype).eval()


def left_padded_prompts(device, padded=True):
    """Token ids `[3, 10]` and their 2-D attention mask; item b has its first 3*b tokens padded."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, LLAMA_CONFIG["vocab_size"], (3, PROMPT_LENGTH), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if padded:
        for b in range(3):
            attention_mask[b, :3 * b] = 0
            input_ids[b, :3 * b] = 0
    return input_ids.to(device), attention_mask.to(device)


def test_register_routes_attention_through_the_operator(monkeypatch):
    calls = []
    attention_probabilities = integration.attention_probabilities

    def counting_probabilities(*args, **kwargs):
        calls.append(args[2])
        return attention_probabilities(*args, **kwargs)

    monkeypatch.setattr(integration, "attention_probabilities", counting_probabilities)
    model = small_llama("cpu", torch.float32)
    model.set_attn_implementation(integration.register())
    input_ids, attention_mask = left_padded_prompts("cpu")
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask)
    assert len(calls) == LLAMA_CONFIG["num_hidden_layers"]
    # The masking interface hands over a bool mask (True = attend) that keeps the padding.
    assert all(mask.dtype == torch.bool and not mask.all() for mask in calls)


def test_register_returns_the_name_and_checks_it():
    assert integration.register("scaled_mask_softmax_custom_name") == "scaled_mask_softmax_custom_name"
    assert "scaled_mask_softmax_custom_name" in transformers.AttentionInterface()
    assert "scaled_mask_softmax_custom_name" in transformers.masking_utils.AttentionMaskInterface()
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        integration.register("")


def test_attention_forward_rejects_inputs_it_would_ignore():
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    with pytest.raises(NotImplementedError, match="softcap, s_aux"):
        integration.attention_forward(torch.nn.Module(), q, k, v, None, softcap=30.0, s_aux=torch.zeros(2))
    with pytest.raises(NotImplementedError, match="indices"):  # sparse attention's chosen keys
        integration.attention_forward(torch.nn.Module(), q, k, v, None, indices=torch.zeros(1, 3, 2))


def test_check_refuses_models_that_compute_attention_themselves():
    llama = small_llama("cpu", torch.float32)
    assert integration.check(llama) is llama
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(n_layer=1, hidden_size=8, n_head=2, vocab_size=16))
    with pytest.raises(NotImplementedError, match="BloomForCausalLM computes attention itself"):
        integration.check(bloom)


# Eager runs its softmax in float32 whatever the model's dtype, which bounds the float64 agreement; and float64 is
# compared unpadded because there the finfo(float64).min of eager's mask becomes -inf in float32, so its padded
# queries get NaN that spreads to every position of their sequence.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, padded, atol, rtol", [(torch.float32, True, 1e-5, 1e-5),
                                                       (torch.float64, False, 1e-6, 1e-6)])
def test_llama_logits_and_attention_weights_match_eager(device, dtype, padded, atol, rtol):
    model = small_llama(device, dtype)
    input_ids, attention_mask = left_padded_prompts(device, padded)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=attention_mask, output_attentions=True)
        model.set_attn_implementation(integration.register())
        out = model(input_ids, attention_mask=attention_mask, output_attentions=True)
    # Padded queries see no key: eager gives them uniform weights, the operator zeros; nothing reads them.
    real = attention_mask.bool()
    torch.testing.assert_close(out.logits[real], expected.logits[real], atol=atol, rtol=rtol)
    for weights, expected_weights in zip(out.attentions, expected.attentions):
        real_queries = real[:, None, :, None].expand_as(weights)
        torch.testing.assert_close(weights[real_queries], expected_weights[real_queries], atol=atol, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
def test_llama_parameter_gradients_match_eager(device):
    model = small_llama(device, torch.float32).train()
    input_ids, attention_mask = left_padded_prompts(device)
    real = attention_mask.bool()
    targets = torch.randint(0, LLAMA_CONFIG["vocab_size"], input_ids.shape, device=device)

    def parameter_gradients():
        model.zero_grad()
        logits = model(input_ids, attention_mask=attention_mask).logits
        # Only real queries: a padded query sees no key, so its output is a convention (eager: uniform weights over
        # every key; the operator: zeros), which a next-token loss on the first real token would otherwise read.
        torch.nn.functional.cross_entropy(logits[real], targets[real]).backward()
        return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}

    expected = parameter_gradients()
    model.set_attn_implementation(integration.register())
    gradients = parameter_gradients()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_llama_attention_dropout_matches_eager(device):
    """Dropout on the probabilities draws the same random mask as eager's under the same seed."""
    model = small_llama(device, torch.float32, attention_dropout=0.5).train()
    input_ids, attention_mask = left_padded_prompts(device, padded=False)

    def logits_under_seed():
        torch.manual_seed(2)
        return model(input_ids, attention_mask=attention_mask).logits

    expected = logits_under_seed()
    model.set_attn_implementation(integration.register())
    torch.testing.assert_close(logits_under_seed(), expected, atol=1e-5, rtol=1e-5)
    model.eval()
    assert not torch.allclose(logits_under_seed(), expected)


# The default cache hands over no mask when there is no padding (causal, lower-right while decoding); a static
# cache's prefill has keys beyond the prompt, for which the mask function builds the mask.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [True, False], ids=["left_padded", "unpadded"])
@pytest.mark.parametrize("cache_implementation", [None, "static"], ids=["dynamic_cache", "static_cache"])
def test_llama_greedy_generation_matches_eager(device, padded, cache_implementation):
    model = small_llama(device, torch.float32)
    input_ids, attention_mask = left_padded_prompts(device, padded)

    def generate():
        return model.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=8,
                              pad_token_id=0, cache_implementation=cache_implementation)

    expected = generate()
    model.set_attn_implementation(integration.register())
    assert torch.equal(generate(), expected)
