"""Hooks and the activation cache of attnkit's models: names, identity, replacement, errors."""

from __future__ import annotations

import pytest
import torch

from attnkit.inspect import interventions

pytestmark = pytest.mark.slow

TEXT = "The capital of France is"


def output(run):
    return run.logits if run.logits is not None else run.hidden_states


@pytest.fixture(params=["smollm2", "minilm"])
def model(request):
    return request.getfixturevalue(request.param)


def test_hook_names_follow_the_architecture(smollm2, minilm):
    names = smollm2.hook_names()
    assert len(names) == 30 * 10 + 1 and names[-1] == "final"
    assert names[:6] == [
        "layers.0.resid_pre",
        "layers.0.attn.q",
        "layers.0.attn.k",
        "layers.0.attn.v",
        "layers.0.attn.pattern",
        "layers.0.attn.z",
    ]
    assert "layers.5.mlp_out" in minilm.hook_names() and "layers.6.mlp_out" not in minilm.hook_names()


def test_identity_hooks_leave_logits_identical(model):
    plain = model.run(TEXT, attention=False)
    names = [name for name in model.hook_names() if not name.endswith("pattern")]
    with model.hooks({name: (lambda t: None) for name in names}):
        hooked = model.run(TEXT, attention=False)
    assert torch.equal(output(plain), output(hooked))
    # With the weights materialised in every layer, hooks returning them unchanged too.
    with_weights = model.run(TEXT)
    with model.hooks({name: (lambda t: t) for name in model.hook_names()}):
        hooked = model.run(TEXT)
    assert torch.equal(output(with_weights), output(hooked))
    assert all(torch.equal(with_weights.attentions[i], hooked.attentions[i]) for i in range(model.num_layers))


def test_cache_returns_the_named_activations(smollm2):
    run = smollm2.run(
        TEXT,
        attention=[2],
        cache=[
            "layers.2.attn.q",
            "layers.2.attn.k",
            "layers.2.attn.pattern",
            "layers.2.attn.z",
            "layers.2.resid_post",
            "final",
        ],
    )
    cache = run.cache
    assert cache["layers.2.attn.q"].shape == (1, 9, 5, 64) and cache["layers.2.attn.k"].shape == (1, 3, 5, 64)
    assert cache["layers.2.attn.z"].shape == (1, 9, 5, 64) and cache["layers.2.resid_post"].shape == (1, 5, 576)
    assert torch.equal(cache["layers.2.attn.pattern"], run.attentions[2])
    assert torch.equal(cache["final"].float(), run.hidden_states)
    # z is the pattern applied to the values of each head's key/value group.
    values = smollm2.run(TEXT, attention=False, cache=["layers.2.attn.v"]).cache["layers.2.attn.v"]
    expected = run.attentions[2] @ values.repeat_interleave(3, dim=1)
    assert (cache["layers.2.attn.z"] - expected).abs().max() < 1e-5
    # The residual stream out of one layer is the stream into the next.
    nxt = smollm2.run(TEXT, attention=False, cache=["layers.2.resid_post", "layers.3.resid_pre"]).cache
    assert torch.equal(nxt["layers.2.resid_post"], nxt["layers.3.resid_pre"])


def test_a_hook_that_zeroes_a_heads_z_equals_the_ablation(smollm2, minilm):
    for model, target in ((smollm2, " Paris"), (minilm, None)):
        ablation = interventions.head_ablation(model, TEXT, target=target, layers=[1])
        plain = model.run(TEXT, attention=False)
        for head in (0, model.num_heads - 1):

            def zero(z, head=head):
                z = z.clone()
                z[:, head] = 0
                return z

            with model.hooks({"layers.1.attn.z": zero}):
                ablated = model.run(TEXT, attention=False)
            if model.causal:
                target_id = model.tokenize(target).ids[0, 0]
                effect = (torch.log_softmax(ablated.logits[0, -1], -1) - torch.log_softmax(plain.logits[0, -1], -1))[
                    target_id
                ]
            else:
                effect = (
                    torch.nn.functional.cosine_similarity(
                        ablated.hidden_states[0].mean(0), plain.hidden_states[0].mean(0), dim=0
                    )
                    - 1
                )
            assert abs(float(effect) - float(ablation.effects[0, head])) < 1e-5, (model.name, head)
            assert float(effect) != 0.0


def test_a_replaced_pattern_changes_the_output(smollm2):
    plain = smollm2.run(TEXT, attention=False)

    def first_token_only(pattern):
        replaced = torch.zeros_like(pattern)
        replaced[..., 0] = 1.0
        return replaced

    with smollm2.hooks({"layers.0.attn.pattern": first_token_only}):
        hooked = smollm2.run(TEXT, attention=[0], cache=["layers.0.attn.z", "layers.0.attn.v"])
    assert torch.equal(hooked.attentions[0], torch.zeros(1, 9, 5, 5).index_fill_(-1, torch.tensor([0]), 1.0))
    # Every query now reads the first token's value.
    z, v = hooked.cache["layers.0.attn.z"], hooked.cache["layers.0.attn.v"]
    assert torch.allclose(z, v[:, :, :1].repeat_interleave(3, dim=1).expand_as(z))
    assert (hooked.logits - plain.logits).abs().max() > 1e-2


def test_hooks_apply_only_inside_their_block_and_to_their_model(smollm2, minilm):
    calls = []
    with smollm2.hooks({"final": calls.append}):
        minilm.run("hi", attention=False)
        assert calls == []
        smollm2.run("hi", attention=False)
        assert len(calls) == 1
    smollm2.run("hi", attention=False)
    assert len(calls) == 1


def test_run_with_hooks_takes_a_batch_and_lets_gradients_flow(smollm2):
    ids = smollm2.tokenize(TEXT).ids.expand(2, -1)
    kept = {}

    def keep(pattern):
        kept["pattern"] = pattern.clone()
        return kept["pattern"]

    with torch.enable_grad():
        hooked = smollm2.run_with_hooks(ids, hooks={"layers.4.attn.pattern": keep}, cache=["layers.4.attn.z"])
        (grad,) = torch.autograd.grad(hooked.hidden_states.sum(), kept["pattern"])
    assert hooked.hidden_states.shape == (2, 5, 576) and hooked.cache["layers.4.attn.z"].shape == (2, 9, 5, 64)
    assert grad.shape == (2, 9, 5, 5) and grad.abs().max() > 0


def test_unknown_hook_names_are_listed(smollm2):
    with pytest.raises(
        ValueError,
        match=r"unknown hook name 'layers.3.attn.out'; smollm2 has "
        r"layers.\{0..29\}.\{resid_pre, attn.q, .*, resid_post\} and final",
    ):
        with smollm2.hooks({"layers.3.attn.out": print}):
            pass
    with pytest.raises(ValueError, match="unknown cache names 'layers.30.attn.z', 'embed'"):
        smollm2.run(TEXT, cache=["layers.30.attn.z", "embed"])
    with pytest.raises(TypeError, match="the hook on 'final' must be a function of the activation, got int"):
        with smollm2.hooks({"final": 3}):
            pass
    with pytest.raises(
        ValueError,
        match=r"hook on 'layers.0.attn.z' must return None or a tensor shaped like its "
        r"input \[b, 9, 5, 64\], got \[1, 9, 5\]",
    ):
        with smollm2.hooks({"layers.0.attn.z": lambda z: z[..., 0]}):
            smollm2.run(TEXT, attention=False)
