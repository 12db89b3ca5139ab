"""Hooks and the activation cache of attnkit's models: names, identity, replacement, errors."""

from __future__ import annotations

import pytest
import torch

from attnkit.inspect import interventions

pytestmark = pytest.mark.slow

TEXT = "The capital of France is"


def output(run):
    return run.logits if run.logits is not None else run.last_hidden_state


@pytest.fixture(params=["smollm2", "minilm"])
def model(request):
    return request.getfixturevalue(request.param)


def test_hook_names_follow_the_module_tree(smollm2, minilm):
    names = smollm2.hook_names()
    assert (
        len(names) == 1 + 30 * 18 + 2
        and names[0] == "embed"
        and names[-2:] == ["decoder.final_norm.scale", "decoder.final"]
    )
    assert names[1:11] == [
        "decoder.layers.0.resid_pre",
        "decoder.layers.0.self_attn.q_unrotated",  # before the rotary encoding
        "decoder.layers.0.self_attn.k_unrotated",
        "decoder.layers.0.self_attn.q",
        "decoder.layers.0.self_attn.k",
        "decoder.layers.0.self_attn.v",
        "decoder.layers.0.self_attn.scores",
        "decoder.layers.0.self_attn.pattern",
        "decoder.layers.0.self_attn.z",
        "decoder.layers.0.self_attn.result",
    ]
    modules = dict(smollm2.module.named_modules())
    assert all(name in modules for name in names)
    assert "encoder.layers.5.mlp_out" in minilm.hook_names() and "encoder.layers.6.mlp_out" not in minilm.hook_names()
    assert smollm2.hook_name("z", 3) == "decoder.layers.3.self_attn.z"
    assert minilm.hook_name("self_attn.pattern", -1) == "encoder.layers.5.self_attn.pattern"


def test_identity_hooks_leave_logits_identical(model):
    plain = model.run(TEXT, return_weights=False)
    names = [name for name in model.hook_names() if not name.endswith(("pattern", "scores"))]
    with model.hooks({name: (lambda t: None) for name in names}):
        hooked = model.run(TEXT, return_weights=False)
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
        return_weights=[2],
        names_filter=[
            "decoder.layers.2.self_attn.q",
            "decoder.layers.2.self_attn.k",
            "decoder.layers.2.self_attn.pattern",
            "decoder.layers.2.self_attn.z",
            "decoder.layers.2.resid_post",
            "decoder.final",
        ],
    )
    cache = run.cache
    assert cache["q", 2].shape == (1, 9, 5, 64) and cache["k", 2].shape == (1, 3, 5, 64)
    assert cache["z", 2].shape == (1, 9, 5, 64) and cache["resid_post", 2].shape == (1, 5, 576)
    assert torch.equal(cache["pattern", 2], run.attentions[2])
    assert torch.equal(cache["decoder.final"].float(), run.last_hidden_state)
    # z is the pattern applied to the values of each head's key/value group.
    values = smollm2.run(TEXT, return_weights=False, names_filter=["decoder.layers.2.self_attn.v"]).cache["v", 2]
    expected = run.attentions[2] @ values.repeat_interleave(3, dim=1)
    assert (cache["z", 2] - expected).abs().max() < 1e-5
    # The residual stream out of one layer is the stream into the next.
    nxt = smollm2.run(
        TEXT, return_weights=False, names_filter=lambda name: name.endswith((".2.resid_post", ".3.resid_pre"))
    ).cache
    assert list(nxt) == ["decoder.layers.2.resid_post", "decoder.layers.3.resid_pre"]
    assert torch.equal(nxt["resid_post", 2], nxt["resid_pre", 3])


def test_a_hook_that_zeroes_a_heads_z_equals_the_ablation(smollm2, minilm):
    for model, target in ((smollm2, " Paris"), (minilm, None)):
        ablation = interventions.head_ablation(model, TEXT, target=target, layers=[1])
        plain = model.run(TEXT, return_weights=False)
        for head in (0, model.num_heads - 1):

            def zero(z, head=head):
                z = z.clone()
                z[:, head] = 0
                return z

            with model.hooks({model.hook_name("z", 1): zero}):
                ablated = model.run(TEXT, return_weights=False)
            if model.causal:
                target_id = model.tokenize(target).ids[0, 0]
                effect = (torch.log_softmax(ablated.logits[0, -1], -1) - torch.log_softmax(plain.logits[0, -1], -1))[
                    target_id
                ]
            else:
                effect = (
                    torch.nn.functional.cosine_similarity(
                        ablated.last_hidden_state[0].mean(0), plain.last_hidden_state[0].mean(0), dim=0
                    )
                    - 1
                )
            assert abs(float(effect) - float(ablation.effects[0, head])) < 1e-5, (model.name, head)
            assert float(effect) != 0.0


def test_a_replaced_pattern_changes_the_output(smollm2):
    plain = smollm2.run(TEXT, return_weights=False)

    def first_token_only(pattern):
        replaced = torch.zeros_like(pattern)
        replaced[..., 0] = 1.0
        return replaced

    with smollm2.hooks({"decoder.layers.0.self_attn.pattern": first_token_only}):
        hooked = smollm2.run(
            TEXT, return_weights=[0], names_filter=["decoder.layers.0.self_attn.z", "decoder.layers.0.self_attn.v"]
        )
    assert torch.equal(hooked.attentions[0], torch.zeros(1, 9, 5, 5).index_fill_(-1, torch.tensor([0]), 1.0))
    # Every query now reads the first token's value.
    z, v = hooked.cache["z", 0], hooked.cache["v", 0]
    assert torch.allclose(z, v[:, :, :1].repeat_interleave(3, dim=1).expand_as(z))
    assert (hooked.logits - plain.logits).abs().max() > 1e-2


def test_hooks_apply_only_inside_their_block_and_to_their_model(smollm2, minilm):
    calls = []
    with smollm2.hooks({"decoder.final": calls.append}):
        minilm.run("hi", return_weights=False)
        assert calls == []
        smollm2.run("hi", return_weights=False)
        assert len(calls) == 1
    smollm2.run("hi", return_weights=False)
    assert len(calls) == 1


def test_run_with_hooks_takes_a_batch_and_lets_gradients_flow(smollm2):
    ids = smollm2.tokenize(TEXT).ids.expand(2, -1)
    kept = {}

    def keep(pattern):
        kept["pattern"] = pattern.clone()
        return kept["pattern"]

    with torch.enable_grad():
        hooked = smollm2.run_with_hooks(
            ids, hooks={"decoder.layers.4.self_attn.pattern": keep}, names_filter=["decoder.layers.4.self_attn.z"]
        )
        (grad,) = torch.autograd.grad(hooked.last_hidden_state.sum(), kept["pattern"])
    assert hooked.last_hidden_state.shape == (2, 5, 576) and hooked.cache["z", 4].shape == (2, 9, 5, 64)
    assert hooked.logits is not None and hooked.logits.shape == (2, 5, 49152)
    assert grad.shape == (2, 9, 5, 5) and grad.abs().max() > 0


def test_unknown_hook_names_are_listed(smollm2):
    with pytest.raises(
        ValueError,
        match=r"unknown hook name 'layers.3.attn.out'; the names are embed, "
        r"decoder.layers.\{0..29\}.\{resid_pre, self_attn.q_unrotated, .*, resid_post\}, decoder.final_norm.scale, decoder.final",
    ):
        with smollm2.hooks({"layers.3.attn.out": print}):
            pass
    with pytest.raises(ValueError, match="unknown cached names 'decoder.layers.30.self_attn.z', 'final'"):
        smollm2.run(TEXT, names_filter=["decoder.layers.30.self_attn.z", "final"])
    with pytest.raises(TypeError, match="the hook on 'decoder.final' must be a function of the activation, got int"):
        with smollm2.hooks({"decoder.final": 3}):
            pass
    with pytest.raises(
        ValueError,
        match=r"hook on 'decoder.layers.0.self_attn.z' must return None or a tensor shaped like its "
        r"input \[b, 9, 5, 64\], got \[1, 9, 5\]",
    ):
        with smollm2.hooks({"decoder.layers.0.self_attn.z": lambda z: z[..., 0]}):
            smollm2.run(TEXT, return_weights=False)


def test_an_empty_input_and_a_hook_that_changes_the_batch_say_what_was_expected(tmp_path):
    from attnkit import models
    from tests.fixtures.crafted import write_tiny_llama

    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    with pytest.raises(ValueError, match="tiny needs a text, a list of texts or token ids, got an empty list"):
        model.run_with_cache([])

    def twice(x, hook=None):
        return torch.cat([x, x])  # [2 b, s, e]

    with (
        model.hooks([("embed", twice)]),
        pytest.raises(ValueError, match="each step must give 1 token; a hook changed the batch to 2 rows"),
    ):
        list(model.generate_ids("the cat", max_new_tokens=3))
