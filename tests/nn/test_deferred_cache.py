"""Cache entries computed when first read (attnkit.nn.activation_cache.DeferredActivations):
a pass that only caches an attention layer's scores, pattern and per-head result leaves
them to be computed from its recorded queries, keys and head outputs; what a read returns
is what a pass that formed them (because a hook was on them) records, bit for bit, for
every kind of score, mask and bias; they are formed during the pass whenever they could
not be recomputed later (gradients, a KV cache), and a read after their inputs changed in
place refuses."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest
import torch

from attnkit.nn import (
    AdditiveAttention,
    ALiBi,
    AttentionConfig,
    DecoderLM,
    DecoderLMConfig,
    KVCache,
    MultiHeadAttention,
    RelativePositionBias,
    Transformer,
    TransformerConfig,
)
from attnkit.nn.hooks import HookedModule

DEFERRED = ("scores", "pattern", "result")


class OneAttention(HookedModule):
    """A hooked module around one attention layer, attending causally or under a mask."""

    def __init__(self, attention: MultiHeadAttention) -> None:
        super().__init__()
        self.attn = attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.attn(x, causal=mask is None, mask=mask)


def formed_during_the_pass(module: HookedModule, *args) -> dict[str, torch.Tensor]:
    """Every activation of a pass with a reading hook on each deferrable point: the pass
    forms them, as it does when a hook may replace them."""
    names = [name for name in module.hook_names() if name.endswith(DEFERRED)]
    with torch.no_grad(), module.hook_session({name: lambda t: None for name in names}, names_filter=None) as cache:
        module(*args)
    assert cache.unread() == []
    return dict(cache)


def cached_without_hooks(module: HookedModule, *args):
    with torch.no_grad():
        return module.run_with_cache(*args)


ATTENTIONS: dict[str, Callable[[], MultiHeadAttention]] = {
    "grouped queries": lambda: MultiHeadAttention(AttentionConfig(16, 4, num_kv_heads=2)),
    "softcap and window": lambda: MultiHeadAttention(AttentionConfig(16, 2, softcap=5.0, window=3, scale=0.3)),
    "ALiBi": lambda: MultiHeadAttention(AttentionConfig(16, 4), positional=ALiBi(4)),
    "relative positions": lambda: MultiHeadAttention(
        AttentionConfig(16, 2, score="dot"), positional=RelativePositionBias(2, bidirectional=False)
    ),
    "additive score": lambda: MultiHeadAttention(AttentionConfig(16, 2), score_module=AdditiveAttention(8)),
}


@pytest.mark.parametrize("kind", list(ATTENTIONS))
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding mask"])
def test_a_read_returns_what_the_pass_would_have_formed_bit_for_bit(kind, masked) -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS[kind]()).eval()
    x = torch.randn(2, 7, 16)
    args = (x, torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]) if masked else (x,)
    out, cache = cached_without_hooks(module, *args)
    assert sorted(cache.unread()) == sorted(f"attn.{point}" for point in DEFERRED)
    formed = formed_during_the_pass(module, *args)
    assert list(cache) == list(formed)
    for name in formed:
        assert torch.equal(cache[name], formed[name]), name
    assert cache.unread() == [] and torch.equal(out, module(*args))


def test_a_decoder_lm_defers_every_layer_and_reads_compute_only_what_they_need() -> None:
    torch.manual_seed(0)
    lm = DecoderLM(
        DecoderLMConfig(
            16, 4, 32, vocab_size=20, num_layers=2, positional="rotary", num_kv_heads=2, norm="rms", bias=False
        )
    ).eval()
    ids = torch.randint(0, 20, (2, 6))
    _, cache = cached_without_hooks(lm, ids)
    assert len(cache.unread()) == 2 * len(DEFERRED)
    pattern = cache["pattern", 1]
    # One computation gives a layer's scores and pattern: reading one keeps both.
    assert "decoder.layers.1.self_attn.scores" not in cache.unread()
    assert sorted(cache.unread()) == [
        "decoder.layers.0.self_attn.pattern",
        "decoder.layers.0.self_attn.result",
        "decoder.layers.0.self_attn.scores",
        "decoder.layers.1.self_attn.result",
    ]
    assert torch.equal(pattern, formed_during_the_pass(lm, ids)["decoder.layers.1.self_attn.pattern"])
    # The per-head results still sum to the attention output.
    assert torch.allclose(cache["result", 0].sum(1), cache["attn_out", 0], atol=1e-6)


def test_a_filter_of_patterns_alone_keeps_no_scores_and_nested_caches_compute_their_own() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad(), module.hook_session(names_filter=None) as outer:
        with module.hook_session(names_filter=["attn.pattern"]) as inner:
            module(x)
    assert list(inner) == ["attn.pattern"] and inner.unread() == ["attn.pattern"]
    assert torch.equal(inner["attn.pattern"], outer["attn.pattern"])
    assert inner["attn.pattern"] is not outer["attn.pattern"]
    assert outer.unread() == ["attn.result"]  # the outer cache's pattern came with its scores


def test_the_cache_reads_as_a_mapping_of_tensors() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    _, cache = cached_without_hooks(module, torch.randn(1, 5, 16))
    assert len(cache) == len(module.hook_names()) and "attn.pattern" in cache and ("pattern", None) in cache
    assert ("pattern", 3) not in cache and "nothing" not in cache
    assert cache.unread() != []  # membership computes nothing
    as_dict = dict(cache)
    assert all(isinstance(t, torch.Tensor) for t in as_dict.values()) and cache.unread() == []
    del cache["attn.scores"]
    _, fresh = cached_without_hooks(module, torch.randn(1, 5, 16))
    copied = pickle.loads(pickle.dumps(fresh))  # torch.save pickles: every entry computed
    assert copied.unread() == [] and torch.equal(copied["attn.pattern"], fresh["attn.pattern"])
    assert "attn.scores" not in cache and repr(cache).startswith("ActivationCache(['attn.q'")


@pytest.mark.parametrize(
    "change, inputs",
    [
        (lambda module, cache: module.attn.out_proj.weight.mul_(2), "per-head results"),
        (lambda module, cache: cache["attn.q"].mul_(2), "scores and pattern"),
    ],
    ids=["an optimizer step on the output projection", "an edit of the cached queries"],
)
def test_a_read_after_its_inputs_changed_in_place_refuses(change, inputs) -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    _, cache = cached_without_hooks(module, torch.randn(1, 5, 16))
    with torch.no_grad():
        change(module, cache)
    name = "attn.result" if inputs == "per-head results" else "attn.pattern"
    with pytest.raises(RuntimeError, match=f"the attn {inputs} of this cache are computed when first read"):
        cache[name]


def test_gradients_inference_mode_and_kv_caches_form_the_weights_during_the_pass() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).train()
    x = torch.randn(1, 5, 16)
    _, cache = module.run_with_cache(x)  # parameters that want gradients: formed now
    assert cache.unread() == [] and cache["attn.pattern"].requires_grad
    with torch.inference_mode():  # inference tensors keep no version counter to check
        _, cache = module.eval().run_with_cache(x)
    assert cache.unread() == [] and torch.equal(
        cache["attn.pattern"], formed_during_the_pass(module, x)["attn.pattern"]
    )
    attention = ATTENTIONS["grouped queries"]().eval()
    wrapped = OneAttention(attention)
    kv_cache = KVCache()
    with torch.no_grad(), wrapped.hook_session(names_filter=None) as cache:
        attention(x[:, :4], causal=True, kv_cache=kv_cache)
        attention(x[:, 4:], causal=True, kv_cache=kv_cache)
    # The cache's buffers are written by later steps: the last step's pattern is kept as formed.
    assert cache.unread() == ["attn.result"] and cache["attn.pattern"].shape == (1, 4, 1, 5)


def test_cross_attention_of_an_encoder_decoder_defers_and_reads_back_exactly() -> None:
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(16, 2, 32, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0)).eval()
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    _, cache = cached_without_hooks(model, src, tgt)
    assert "decoder.layers.0.cross_attn.pattern" in cache.unread()
    formed = formed_during_the_pass(model, src, tgt)
    assert all(torch.equal(cache[name], formed[name]) for name in formed)
