"""Gradients of a loaded model's activations (``Model.run_with_cache(..., incl_bwd=True)``,
backward hooks) against torch.autograd.grad of the same scalar with respect to the same
activations captured by plain forward hooks, on tiny random checkpoints of a LayerNorm
family (GPT-2) and an RMSNorm one (LLaMA 3)."""

from __future__ import annotations

import pytest
import torch

from attnkit import models

pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23"


@pytest.fixture(scope="module", params=["gpt2", "llama_llama3"])
def model(request, tiny_family_folder):
    return models.load(tiny_family_folder(request.param))


def captured_gradients(model, ids, scalar_of, names):
    """``(scalar, name → gradient)`` by torch.autograd.grad on activations captured by
    hooks that return a new tensor of the same values (so that each is in the graph)."""
    captured = {}

    def capture(activation, hook):
        captured[hook.name] = activation = activation.view_as(activation)
        return activation

    with model.hooks(dict.fromkeys(names, capture)):
        scalar = scalar_of(ids)
    gradients = torch.autograd.grad(scalar, [captured[name] for name in names])
    return scalar, dict(zip(names, gradients, strict=True))


def test_the_default_scalar_is_the_loss_and_every_gradient_is_autograds(model):
    ids = model.prepare_input(TEXT)[0]
    logits, cache = model.run_with_cache(ids, incl_bwd=True)
    names = model.hook_names()
    _, expected = captured_gradients(model, ids, model.loss, names)
    assert sorted(cache.grads) == sorted(names)
    for name in names:
        assert torch.allclose(cache.grads[name], expected[name], rtol=1e-5, atol=1e-7), name
    assert not logits.requires_grad and all(p.grad is None for p in model.module.parameters())


def test_a_metric_of_the_logits_and_a_names_filter(model):
    ids = model.prepare_input(TEXT)[0]

    def logit_difference(logits):
        return logits[0, -1, 5] - logits[0, -1, 9]

    names = [model.hook_name("z", 0), model.hook_name("pattern", -1)]
    _, cache = model.run_with_cache(TEXT, incl_bwd=True, metric=logit_difference, names_filter=names)
    _, expected = captured_gradients(model, ids, lambda i: logit_difference(model.run_with_hooks(i).logits), names)
    assert sorted(cache.grads) == sorted(names)
    for name in names:
        assert torch.allclose(cache.grads[name], expected[name], rtol=1e-5, atol=1e-7), name


def test_backward_hooks_of_a_block_and_of_run_with_hooks(model):
    ids = model.prepare_input(TEXT)[0]
    name = model.hook_name("resid_pre", 1)
    seen = []
    with model.hooks({}, backward_hooks={name: lambda gradient: seen.append(gradient)}):
        loss = model.loss(ids)
    loss.backward()
    embed = []
    with model.hooks({}, backward_hooks={"embed": embed.append}):
        zeroed = model.run_with_hooks(ids, backward_hooks={name: lambda gradient: torch.zeros_like(gradient)})
    model.loss_fn(zeroed.logits, ids).backward()
    model.module.zero_grad(set_to_none=True)
    # Every path from the embeddings runs through layer 1's input, whose gradient was zeroed.
    assert len(seen) == 1 and seen[0].abs().max() > 0 and len(embed) == 1 and embed[0].abs().max() == 0


def test_a_metric_needs_incl_bwd_and_must_be_a_scalar(model):
    with pytest.raises(ValueError, match="pass incl_bwd=True"):
        model.run_with_cache(TEXT, metric=lambda logits: logits.sum())
    with pytest.raises(ValueError, match="tensor of one element"):
        model.run_with_cache(TEXT, incl_bwd=True, metric=lambda logits: logits[0, -1])
