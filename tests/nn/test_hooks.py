"""Hook points inside attnkit.nn modules: names from the module tree, identity, replacement
of scores, patterns, per-head results and norm scales, cross-attention, kernels, training."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

from attnkit.nn import (
    AdditiveAttention,
    AttentionConfig,
    DecoderLayer,
    DecoderLM,
    DecoderLMConfig,
    HookPoint,
    LayerConfig,
    MultiHeadAttention,
    RMSNorm,
    Transformer,
    TransformerConfig,
)
from attnkit.nn.hooks import HookedModule


def tiny_lm(**options) -> DecoderLM:
    torch.manual_seed(0)
    defaults = dict(positional="rotary", norm="rms", activation="swiglu", bias=False, num_kv_heads=1)
    return DecoderLM(DecoderLMConfig(16, 2, 32, vocab_size=20, num_layers=2, **(defaults | options))).eval()


class Wrapped(HookedModule):
    """Any module holding attnkit.nn modules gets the hook methods by deriving from
    HookedModule."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(AttentionConfig(16, 2), score_module=AdditiveAttention(8))

    def forward(self, x):
        return self.attn(x, causal=True)


def test_a_decoder_lm_has_hook_names_hooks_and_run_with_cache():
    lm = tiny_lm()
    tokens = torch.randint(0, 20, (2, 5))
    names = lm.hook_names()
    assert names[:5] == [
        "embed",
        "decoder.layers.0.resid_pre",
        "decoder.layers.0.self_attn.q_unrotated",  # rotary: the queries and keys before the rotation
        "decoder.layers.0.self_attn.k_unrotated",
        "decoder.layers.0.self_attn.q",
    ]
    assert "decoder.layers.1.ff.post" in names and "decoder.layers.1.ff_norm.scale" in names
    logits, cache = lm.run_with_cache(tokens)
    assert torch.equal(logits, lm(tokens)) and sorted(cache) == sorted(names)
    assert cache["pattern", 1].shape == (2, 2, 5, 5) and cache["result", 0].shape == (2, 2, 5, 16)
    # The per-head results sum to the attention output (no bias here).
    assert torch.allclose(cache["result", 0].sum(1), cache["attn_out", 0], atol=1e-6)
    # The cache keeps only what a filter accepts.
    _, patterns = lm.run_with_cache(tokens, names_filter=lambda name: name.endswith("pattern"))
    assert list(patterns) == ["decoder.layers.0.self_attn.pattern", "decoder.layers.1.self_attn.pattern"]
    zeroed = lm.run_with_hooks(tokens, hooks={"decoder.layers.0.attn_out": lambda x: x * 0})
    assert not torch.allclose(zeroed, logits)


def test_a_transformer_has_cross_attention_points():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(16, 2, 32, num_encoder_layers=1, num_decoder_layers=2, dropout=0.0)).eval()
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    names = model.hook_names()
    for name in (
        "encoder.layers.0.self_attn.pattern",
        "decoder.layers.1.self_attn.pattern",
        "decoder.layers.1.cross_attn.pattern",
        "decoder.layers.1.cross_attn_out",
        "decoder.layers.1.resid_mid_cross",
        "encoder.final",
        "decoder.final",
    ):
        assert name in names, name
    assert "encoder.layers.0.cross_attn_out" not in names
    out, cache = model.run_with_cache(src, tgt)
    weights = model(src, tgt, return_weights=True)
    assert torch.equal(out, model(src, tgt)) and torch.allclose(out, weights.output, atol=1e-5)
    # The same weights the layer returns (to rounding: earlier layers ran the fused kernel).
    assert torch.allclose(cache["decoder.layers.1.cross_attn.pattern"], weights.decoder_weights[1].cross_attention)
    assert cache["decoder.layers.1.cross_attn.k"].shape == (2, 2, 6, 8)
    with pytest.raises(ValueError, match=r"'pattern' in layer 1 matches several points"):
        model.hook_name("pattern", 1)
    assert model.hook_name("decoder.layers.1.cross_attn.pattern", 1) == "decoder.layers.1.cross_attn.pattern"


def test_replaced_scores_and_pattern_with_an_additive_score():
    model = Wrapped().eval()
    x = torch.randn(1, 4, 16)
    plain = model(x)
    uniform_rows = torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None]

    def uniform(pattern):
        return uniform_rows.expand_as(pattern).clone()

    def flat(scores):
        return torch.where(torch.isinf(scores), scores, torch.zeros_like(scores))

    by_pattern = model.run_with_hooks(x, hooks={"attn.pattern": uniform})
    by_scores, cache = None, None
    with model.hooks({"attn.scores": flat}):
        by_scores, cache = model.run_with_cache(x, names_filter=["attn.pattern", "attn.scores"])
    assert torch.allclose(by_pattern, by_scores, atol=1e-6) and not torch.allclose(by_pattern, plain)
    assert torch.allclose(cache["attn.pattern"][0, 0], uniform_rows)
    assert torch.isinf(cache["attn.scores"][0, 0, 0, 1])  # the causal mask shows as -inf


def test_a_replaced_result_feeds_the_output_and_identity_changes_nothing():
    torch.manual_seed(0)
    attn = MultiHeadAttention(AttentionConfig(16, 4)).eval()
    root = Wrapped().eval()
    root.attn = attn
    x = torch.randn(2, 3, 16)
    plain = root(x)
    assert torch.equal(root.run_with_hooks(x, hooks={"attn.result": lambda r: r}), plain)

    def drop_head_2(result):
        result = result.clone()
        result[:, 2] = 0
        return result

    def drop_z_2(z):
        z = z.clone()
        z[:, 2] = 0
        return z

    assert torch.allclose(
        root.run_with_hooks(x, hooks={"attn.result": drop_head_2}),
        root.run_with_hooks(x, hooks={"attn.z": drop_z_2}),
        atol=1e-6,
    )


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norm_scale_hook_reads_and_replaces_the_scale(norm):
    lm = tiny_lm(norm=norm, bias=norm == "layer")
    tokens = torch.randint(0, 20, (1, 6))
    plain, cache = lm.run_with_cache(
        tokens, names_filter=["decoder.layers.0.resid_pre", "decoder.layers.0.self_attn_norm.scale"]
    )
    x = cache["decoder.layers.0.resid_pre"]
    centred = x if norm == "rms" else x - x.mean(-1, keepdim=True)
    eps = lm.decoder.layers[0].self_attn_norm.eps
    expected = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    assert torch.allclose(cache["decoder.layers.0.self_attn_norm.scale"], expected, atol=1e-6)
    assert torch.equal(lm.run_with_hooks(tokens, hooks={"decoder.layers.0.self_attn_norm.scale": lambda s: s}), plain)
    # The scale recomputed by hand: the same output to rounding.
    same = lm.run_with_hooks(tokens, hooks={"decoder.layers.0.self_attn_norm.scale": lambda s: s.clone()})
    assert torch.allclose(same, plain, atol=1e-5)
    doubled = lm.run_with_hooks(tokens, hooks={"decoder.layers.0.self_attn_norm.scale": lambda s: 2 * s})
    assert not torch.allclose(doubled, plain, atol=1e-3)


def test_kernels_without_weights_have_no_score_points_and_keep_the_others():
    torch.manual_seed(0)
    lm = tiny_lm(kernel="tiled")
    names = lm.hook_names()
    assert not any(name.endswith(("scores", "pattern")) for name in names)
    tokens = torch.randint(0, 20, (1, 5))
    plain = lm(tokens)
    zeroed = lm.run_with_hooks(tokens, hooks={"decoder.layers.0.self_attn.z": lambda z: z * 0})
    assert not torch.allclose(zeroed, plain)


def test_hooks_act_in_training_and_gradients_flow():
    lm = tiny_lm().train()
    tokens = torch.randint(0, 20, (2, 5))
    kept = {}

    def keep(post, hook):
        kept[hook.name] = post
        post.retain_grad()

    with lm.hooks({"decoder.layers.1.ff.post": keep}):
        lm(tokens).sum().backward()
    assert kept["decoder.layers.1.ff.post"].grad.abs().max() > 0


def test_hooks_stay_inside_their_block_and_their_module():
    first, second = tiny_lm(), tiny_lm()
    calls = []
    with first.hooks({"decoder.final": calls.append}):
        second(torch.zeros(1, 2, dtype=torch.long))
        assert calls == []
        first(torch.zeros(1, 2, dtype=torch.long))
        assert len(calls) == 1
    first(torch.zeros(1, 2, dtype=torch.long))
    assert len(calls) == 1


def test_hook_point_is_an_identity_without_hooks():
    point = HookPoint()
    x = torch.randn(2, 3)
    assert point(x) is x and not point.active


@pytest.mark.parametrize("options", [{"parallel": True}, {"output_norms": True}])
def test_every_point_of_parallel_and_output_normed_layers_is_hit_once(options):
    torch.manual_seed(0)
    layers = [
        DecoderLayer(LayerConfig(16, 2, 32, norm="rms", norm_first=True, dropout=0.0, **options), cross_attention=False)
        for _ in range(2)
    ]
    lm = DecoderLM.from_parts(nn.Embedding(20, 16), layers, final_norm=RMSNorm(16)).eval()
    names = lm.hook_names()
    assert ("decoder.layers.0.resid_mid" in names) != options.get("parallel", False)
    calls: Counter[str] = Counter()
    with lm.hooks({name: (lambda x, hook: calls.update([hook.name])) for name in names}):
        lm(torch.randint(0, 20, (1, 4)))
    assert calls == Counter(names)


def test_hook_points_walks_the_module_tree_once_until_it_changes(monkeypatch):
    lm = tiny_lm()
    names = lm.hook_names()
    walks = Counter()
    walk = nn.Module.named_modules

    def counted(module, *args, **kwargs):
        walks[id(module)] += 1
        return walk(module, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_modules", counted)
    tokens = torch.randint(0, 20, (1, 4))
    _, cache = lm.run_with_cache(tokens)
    assert [cache["pattern", layer].shape for layer in (0, 1, -1)] == [(1, 2, 4, 4)] * 3
    assert lm.hook_names() == names and walks[id(lm)] == 0
    # A submodule replaced or added is seen: the tree is walked again.
    lm.decoder.layers[1].self_attn = copy.deepcopy(lm.decoder.layers[1].self_attn)
    assert lm.hook_points()["decoder.layers.1.self_attn.q"] is lm.decoder.layers[1].self_attn.q
    lm.decoder.layers.append(DecoderLayer(LayerConfig(16, 2, 32)))
    assert "decoder.layers.2.self_attn.pattern" in lm.hook_names() and walks[id(lm)] == 2
    # A change that registers nothing is seen once the map is forgotten.
    del lm.decoder.layers[2]
    lm.forget_hook_points()
    assert lm.hook_names() == names and walks[id(lm)] == 3


def test_hook_points_names_each_point_from_the_module_asked():
    lm = tiny_lm()
    lm.hook_points()
    lm.decoder.hook_points()
    assert lm.decoder.layers[0].self_attn.q.name == "layers.0.self_attn.q"
    assert lm.hook_points()["decoder.layers.0.self_attn.q"].name == "decoder.layers.0.self_attn.q"
