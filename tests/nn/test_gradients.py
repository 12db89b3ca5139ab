"""Gradients at hook points: backward hooks and gradients in the cache
(``run_with_cache(..., incl_bwd=True)``) against torch.autograd.grad of the same scalar with
respect to the same activations captured by plain forward hooks, and against finite
differences in float64."""

from __future__ import annotations

import pickle

import pytest
import torch

from attnkit.nn import DecoderLM, DecoderLMConfig


def tiny_lm(norm: str = "layer") -> DecoderLM:
    torch.manual_seed(0)
    config = DecoderLMConfig(
        16, 2, 32, vocab_size=20, num_layers=2, positional="rotary", norm=norm, activation="swiglu", num_kv_heads=1
    )
    return DecoderLM(config).eval().double()


TOKENS = torch.tensor([[1, 5, 7, 2, 9], [3, 3, 8, 0, 4]])


def metric(logits: torch.Tensor) -> torch.Tensor:
    """A scalar of every position's logits: a logit difference at the last two positions."""
    return logits[:, -1, 3].sum() - logits[:, -2, 7].sum()


def reference_gradients(lm: DecoderLM, names: list[str]) -> dict[str, torch.Tensor]:
    """The gradient of :func:`metric` with respect to each activation, taken by
    torch.autograd.grad on the activations plain forward hooks captured. Each hook returns a
    new tensor of the same values, so that the module computes what follows from it (an
    unchanged attention pattern would otherwise leave the output to the fused kernel)."""
    captured = {}

    def capture(activation, hook):
        captured[hook.name] = activation = activation.view_as(activation)
        return activation

    with lm.hooks(dict.fromkeys(names, capture)):
        scalar = metric(lm(TOKENS))
    gradients = torch.autograd.grad(scalar, [captured[name] for name in names])
    return dict(zip(names, gradients, strict=True))


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_cached_gradients_equal_autograd_at_every_point(norm):
    lm = tiny_lm(norm)
    names = lm.hook_names()
    logits, cache = lm.run_with_cache(TOKENS, incl_bwd=True, metric=metric)
    assert torch.allclose(logits, lm(TOKENS)) and not logits.requires_grad
    assert list(cache.grads) != [] and sorted(cache.grads) == sorted(names)
    expected = reference_gradients(lm, names)
    for name in names:
        assert cache.grads[name].shape == cache[name].shape, name
        assert torch.equal(cache.grads[name], expected[name]), name
    # Pattern, per-head result and norm scale gradients are not zero: they are in the graph.
    assert cache.grads["pattern", 1].abs().max() > 0 and cache.grads["result", 0].abs().max() > 0
    assert cache.grads["final_norm.scale", None].abs().max() > 0
    # TransformerLens' names of gradients read them too; the activations come back detached.
    assert torch.equal(cache["decoder.layers.1.self_attn.pattern_grad"], cache.grads["pattern", 1])
    assert "decoder.layers.1.self_attn.pattern_grad" in cache and "decoder.layers.1.nothing_grad" not in cache
    assert not any(t.requires_grad for t in cache.values()) and not any(t.requires_grad for t in cache.grads.values())
    copied = pickle.loads(pickle.dumps(cache))
    assert all(torch.equal(copied.grads[name], cache.grads[name]) for name in names)


def test_a_names_filter_selects_the_gradients_and_the_parameters_keep_no_grad():
    lm = tiny_lm()
    _, cache = lm.run_with_cache(TOKENS, incl_bwd=True, metric=metric, names_filter=lambda n: n.endswith("pattern"))
    assert sorted(cache.grads) == ["decoder.layers.0.self_attn.pattern", "decoder.layers.1.self_attn.pattern"]
    expected = reference_gradients(lm, list(cache.grads))
    assert all(torch.equal(cache.grads[name], expected[name]) for name in cache.grads)
    assert all(p.grad is None for p in lm.parameters())


def test_gradients_flow_when_the_parameters_want_none():
    lm = tiny_lm().requires_grad_(False)
    _, cache = lm.run_with_cache(TOKENS, incl_bwd=True, metric=metric)
    expected = reference_gradients(tiny_lm(), lm.hook_names())
    assert all(torch.equal(cache.grads[name], expected[name]) for name in lm.hook_names())


def test_gradients_equal_finite_differences():
    """metric(activation + ε·direction) - metric(activation - ε·direction) over 2ε equals
    the cached gradient along the direction, at points of every kind."""
    lm = tiny_lm()
    _, cache = lm.run_with_cache(TOKENS, incl_bwd=True, metric=metric)
    generator = torch.Generator().manual_seed(1)
    eps = 1e-6
    for name in [
        "embed",
        "decoder.layers.0.self_attn.pattern",
        "decoder.layers.0.self_attn.q",
        "decoder.layers.1.self_attn.result",
        "decoder.layers.1.ff.post",
        "decoder.final_norm.scale",
    ]:
        direction = torch.randn(cache[name].shape, generator=generator, dtype=torch.float64)
        finite = (moved(lm, name, eps * direction) - moved(lm, name, -eps * direction)) / (2 * eps)
        assert finite == pytest.approx((cache.grads[name] * direction).sum().item(), rel=1e-6, abs=1e-8), name


def moved(lm: DecoderLM, name: str, step: torch.Tensor) -> float:
    """:func:`metric` with ``step`` added to the activation ``name``."""
    with lm.hooks({name: lambda activation: activation + step}):
        return metric(lm(TOKENS)).item()


def test_backward_hooks_read_and_replace_gradients():
    lm = tiny_lm()
    _, plain = lm.run_with_cache(TOKENS, incl_bwd=True, metric=metric)
    seen = {}

    def double(gradient, hook):
        seen[hook.name] = gradient
        return 2 * gradient

    with lm.hook_session(
        names_filter=["embed", "decoder.layers.1.resid_pre"],
        backward_hooks={"decoder.layers.1.resid_pre": double},
        incl_bwd=True,
    ) as cache:
        logits = lm(TOKENS)
    # The hooks act in a backward pass after the block: they are on the pass's tensors.
    metric(logits).backward()
    # (``plain`` watched every point, so that its attention took the explicit path: equal
    # up to float64 rounding.)
    assert torch.allclose(seen["decoder.layers.1.resid_pre"], plain.grads["resid_pre", 1], rtol=1e-12, atol=1e-14)
    assert torch.equal(cache.grads["resid_pre", 1], 2 * seen["decoder.layers.1.resid_pre"])
    # Every path from the embeddings runs through layer 1's input: their gradient doubles.
    assert torch.allclose(cache.grads["embed"], 2 * plain.grads["embed"], rtol=1e-12, atol=1e-14)


def test_run_with_hooks_takes_backward_hooks_that_only_read():
    lm = tiny_lm()
    _, plain = lm.run_with_cache(TOKENS, incl_bwd=True, metric=metric)
    seen = []
    logits = lm.run_with_hooks(TOKENS, backward_hooks={"decoder.layers.0.self_attn.z": seen.append})
    assert seen == []  # nothing until the backward pass
    metric(logits).backward()
    assert len(seen) == 1 and torch.allclose(seen[0], plain.grads["z", 0], rtol=1e-12, atol=1e-14)


def test_points_without_backward_hooks_or_gradients_cost_nothing():
    """A pass that watches no gradient keeps the fused path bit for bit; a cache without
    incl_bwd leaves the patterns to be computed when read."""
    lm = tiny_lm()
    plain = lm(TOKENS)
    with lm.hooks({}, backward_hooks={"decoder.layers.1.resid_post": lambda g: None}):
        assert torch.equal(lm(TOKENS), plain)
    with torch.no_grad():
        _, cache = lm.run_with_cache(TOKENS)
    assert "decoder.layers.0.self_attn.pattern" in cache.unread()
    point = dict(lm.named_modules())["decoder.layers.0.self_attn.pattern"]
    with lm.hook_session(names_filter=None):
        assert point.active and not point.watches_gradient
    with torch.no_grad(), lm.hook_session(names_filter=None, incl_bwd=True):
        assert not point.watches_gradient  # no gradient is recorded: nothing to watch


def test_incl_bwd_refuses_what_it_cannot_run_from():
    lm = tiny_lm()
    with pytest.raises(ValueError, match="tensor of one element"):
        lm.run_with_cache(TOKENS, incl_bwd=True)
    with pytest.raises(ValueError, match="pass incl_bwd=True"):
        lm.run_with_cache(TOKENS, metric=metric)
    with pytest.raises(ValueError, match="unknown backward hook name"):
        lm.run_with_hooks(TOKENS, backward_hooks={"nowhere": print})
