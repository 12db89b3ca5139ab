"""TransformerLens' hook names and layouts on attnkit's points: TL's hook code, written as
in TL's documentation, gives the numbers of the same intervention written with attnkit's
names; TL's names read the cache in TL's layout (views); the points before the rotary
encoding equal transformers' own projections."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.nn.transformerlens_names import get_act_name, transformerlens_aliases

transformers = pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23"


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])
def model(request, tiny_family_folder):
    return models.load(tiny_family_folder(request.param))


@pytest.fixture(scope="module")
def qwen2(tiny_family_folder):
    return models.load(tiny_family_folder("qwen2"))


def _ids(model):
    return model.to_tokens(TEXT)[0]


# (TL's activation, a TL hook as TL's docs write it, the same intervention on attnkit's point)
def _tl_zero_head(t, hook):
    t[:, :, 1] = 0  # [b, s, h, d]: head 1


def _ak_zero_head(t):
    t = t.clone()
    t[:, 1] = 0  # [b, h, s, d]
    return t


def _tl_scale_position(t, hook):
    return t * torch.arange(1, t.shape[1] + 1, dtype=t.dtype)[None, :, None, None]  # positions on dim 1


def _ak_scale_position(t):
    return t * torch.arange(1, t.shape[2] + 1, dtype=t.dtype)[None, None, :, None]  # positions on dim 2


def _tl_pattern_to_first(pattern, hook):
    pattern[:, 2] = 0  # [b, h, q, k] in both
    pattern[:, 2, :, 0] = 1


def _ak_pattern_to_first(pattern):
    pattern = pattern.clone()
    pattern[:, 2] = 0
    pattern[:, 2, :, 0] = 1
    return pattern


@pytest.mark.parametrize("act", ["z", "q", "k", "v", "rot_q", "rot_k", "result"])
@pytest.mark.parametrize("edit", ["zero_head", "scale_position"])
def test_tl_hook_code_equals_attnkit_names(model, act, edit):
    tl_fn, ak_fn = {
        "zero_head": (_tl_zero_head, _ak_zero_head),
        "scale_position": (_tl_scale_position, _ak_scale_position),
    }[edit]
    ids = _ids(model)
    alias = transformerlens_aliases(model.hook_names())[get_act_name(act, 1)]
    with torch.no_grad():
        tl = model.run_with_hooks(ids, hooks={get_act_name(act, 1): tl_fn}).logits
        ours = model.run_with_hooks(ids, hooks={alias.point: ak_fn}).logits
        plain = model.run_with_hooks(ids).logits
    assert torch.equal(tl, ours)
    assert (tl - plain).abs().max() > 1e-3  # the intervention changed something


def test_tl_pattern_hook_and_permanent_hook(model):
    ids = _ids(model)
    with torch.no_grad():
        tl = model.run_with_hooks(ids, hooks={"blocks.1.attn.hook_pattern": _tl_pattern_to_first}).logits
        ours = model.run_with_hooks(ids, hooks={model.hook_name("pattern", 1): _ak_pattern_to_first}).logits
        model.add_hook("blocks.1.attn.hook_pattern", _tl_pattern_to_first)
        try:
            permanent = model.run_with_hooks(ids).logits
        finally:
            model.reset_hooks()
    torch.testing.assert_close(tl, ours, rtol=0, atol=1e-6)
    torch.testing.assert_close(permanent, ours, rtol=0, atol=1e-6)


def test_a_tl_hook_gets_its_tl_name_and_layer(model):
    seen = []

    def record(z, hook):
        seen.append((hook.name, hook.layer(), tuple(z.shape)))

    with torch.no_grad(), model.hooks({"blocks.1.attn.hook_z": record}):
        model.run(TEXT, return_weights=False)
    ((name, layer, shape),) = seen
    assert (name, layer) == ("blocks.1.attn.hook_z", 1)
    assert shape == (1, len(TEXT.split()), model.num_heads, shape[3])  # [b, s, h, d]


def test_cache_by_tl_names_is_a_view_in_tl_layout(model):
    ids = _ids(model)
    _, cache = model.run_with_cache(ids)
    for act, point in [
        ("z", "self_attn.z"),
        ("v", "self_attn.v"),
        ("result", "self_attn.result"),
        ("rot_k", "self_attn.k"),
    ]:
        ours = cache[point, 1]  # [b, h, s, d]
        tl = cache[get_act_name(act, 1)]  # [b, s, h, d]
        assert torch.equal(tl, ours.transpose(1, 2))
        assert tl.data_ptr() == ours.data_ptr()  # a view, no copy
    for tl_name, point in [
        ("blocks.0.hook_resid_pre", ("resid_pre", 0)),
        ("blocks.1.hook_resid_mid", ("resid_mid", 1)),
        ("blocks.1.hook_resid_post", ("resid_post", 1)),
        ("blocks.1.hook_attn_out", ("attn_out", 1)),
        ("blocks.1.hook_mlp_out", ("mlp_out", 1)),
        ("blocks.1.attn.hook_pattern", ("pattern", 1)),
        ("blocks.1.attn.hook_attn_scores", ("scores", 1)),
        ("blocks.1.mlp.hook_post", ("ff.post", 1)),
        ("blocks.1.ln1.hook_scale", ("self_attn_norm.scale", 1)),
        ("hook_embed", ("embed", None)),
        ("ln_final.hook_scale", ("final_norm.scale", None)),
        ("ln_final.hook_normalized", ("final", None)),
    ]:
        assert tl_name in cache
        assert torch.equal(cache[tl_name], cache[point])


def test_names_filter_takes_tl_names_and_predicates(model):
    ids = _ids(model)
    _, by_names = model.run_with_cache(ids, names_filter=[get_act_name("z", 0), "blocks.1.hook_resid_post"])
    assert sorted(by_names) == sorted([model.hook_name("z", 0), model.hook_name("resid_post", 1)])
    _, by_predicate = model.run_with_cache(ids, names_filter=lambda name: name.endswith("hook_pattern"))
    assert sorted(by_predicate) == sorted(model.hook_name("pattern", i) for i in range(model.num_layers))


def test_unknown_tl_name_is_refused(model):
    with pytest.raises(ValueError, match="unknown hook name 'blocks.99.attn.hook_z'"):
        model.run_with_hooks(_ids(model), hooks={"blocks.99.attn.hook_z": _tl_zero_head})
    _, cache = model.run_with_cache(_ids(model), names_filter=["blocks.0.attn.hook_z"])
    with pytest.raises(KeyError):
        cache["blocks.1.attn.hook_z"]


def test_points_before_the_rotation_equal_transformers_projections(qwen2, tiny_family_folder):
    """TL's hook_q / hook_k (attnkit's q_unrotated / k_unrotated) are transformers' q_proj
    and k_proj outputs per head; hook_rot_q / hook_rot_k are attnkit's q / k."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_family_folder("qwen2"), attn_implementation="eager")
    ids = _ids(qwen2)
    seen = {}
    attention = hf.model.layers[1].self_attn
    handles = [
        attention.q_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out)),
        attention.k_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out)),
    ]
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for handle in handles:
            handle.remove()
    _, cache = qwen2.run_with_cache(ids)
    d = (
        qwen2.config.head_dim
        if getattr(qwen2.config, "head_dim", None)
        else qwen2.config.hidden_size // qwen2.num_heads
    )
    for act in ("q", "k"):
        tl = cache[get_act_name(act, 1)]  # [b, s, h, d]
        torch.testing.assert_close(tl, seen[act].view(1, ids.shape[1], -1, d), rtol=1e-4, atol=1e-5)
        assert torch.equal(cache[get_act_name("rot_" + act, 1)], cache[f"self_attn.{act}", 1].transpose(1, 2))
        assert not torch.allclose(cache[get_act_name(act, 1)], cache[get_act_name("rot_" + act, 1)])


def test_unrotated_points_cost_nothing_unused(qwen2):
    """With nothing on them, the points before the rotation change no bit of a run."""
    ids = _ids(qwen2)
    with torch.no_grad():
        plain = qwen2.run_with_hooks(ids).logits
        identity = qwen2.run_with_hooks(ids, hooks={"blocks.0.attn.hook_q": lambda q, hook: None}).logits
    assert torch.equal(plain, identity)


def test_no_unrotated_points_without_rotary(tiny_family_folder):
    gpt2 = models.load(tiny_family_folder("gpt2"))
    assert not any(name.endswith("_unrotated") for name in gpt2.hook_names())
    assert transformerlens_aliases(gpt2.hook_names())["blocks.0.attn.hook_q"].point == gpt2.hook_name("self_attn.q", 0)


@pytest.mark.slow
def test_smollm2_positions_and_tl_hooks_as_transformerlens(smollm2):
    """SmolLM2: TL's positions with prepend_bos=True (TL says 9 where the tokenizer's own
    tokens say 8), and TL's hook code on the real model equals attnkit's intervention."""
    text = "The capital of France is Paris. The capital of Italy is"
    assert smollm2.get_token_position(" capital", text, mode="last") == 8
    assert smollm2.get_token_position(" capital", text, mode="last", prepend_bos=True) == 9
    tokens = smollm2.to_tokens(text, prepend_bos=True, return_mask=False)
    assert tokens[0, 0] == smollm2.bos_token_id
    with torch.no_grad():
        tl = smollm2.run_with_hooks(tokens, hooks={get_act_name("z", 5): _tl_zero_head}, return_type="logits")
        ours = smollm2.run_with_hooks(tokens, hooks={smollm2.hook_name("z", 5): _ak_zero_head}).logits
        plain = smollm2.run_with_hooks(tokens).logits
    assert torch.equal(tl, ours) and (tl - plain).abs().max() > 1e-3


def test_one_name_as_a_string_is_a_names_filter(model):
    """TransformerLens takes ``names_filter="blocks.0.attn.hook_z"``: that one point."""
    _, cache = model.run_with_cache(_ids(model), names_filter="blocks.0.attn.hook_z")
    assert list(cache) == [model.hook_name("z", 0)]
    _, cache = model.run_with_cache(_ids(model), names_filter=model.hook_name("pattern", 1))
    assert list(cache) == [model.hook_name("pattern", 1)]


def test_gradients_by_tl_names_in_tl_layout(model):
    """``cache["blocks.1.attn.hook_z_grad"]``, as TL names a gradient: attnkit's gradient of
    ``z``, positions before heads."""
    _, cache = model.run_with_cache(_ids(model), incl_bwd=True)
    ours = cache.grads["z", 1]  # [b, h, s, d]
    assert torch.equal(cache["blocks.1.attn.hook_z_grad"], ours.transpose(1, 2))
    assert torch.equal(cache.grads["blocks.1.hook_resid_pre"], cache.grads["resid_pre", 1])


def test_tl_fwd_hooks_as_written(model):
    """TL's call, ``fwd_hooks=[(name or predicate, fn)]``, in ``run_with_hooks`` and in the
    ``hooks`` block: the numbers of the same hooks given by name."""
    ids = _ids(model)
    every_z = {get_act_name("z", layer): _tl_zero_head for layer in range(model.num_layers)}
    with torch.no_grad():
        by_name = model.run_with_hooks(ids, hooks=every_z, return_type="logits")
        listed = model.run_with_hooks(ids, return_type="logits", fwd_hooks=list(every_z.items()))
        predicate = model.run_with_hooks(
            ids, return_type="logits", fwd_hooks=[(lambda name: name.endswith("hook_z"), _tl_zero_head)]
        )
        with model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_z"), _tl_zero_head)]):
            in_block = model.run_with_hooks(ids, return_type="logits")
        attnkit_names = model.run_with_hooks(
            ids, return_type="logits", hooks=[(lambda name: name.endswith("self_attn.z"), _ak_zero_head)]
        )
        plain = model.run_with_hooks(ids, return_type="logits")
    assert torch.equal(listed, by_name) and torch.equal(predicate, by_name) and torch.equal(in_block, by_name)
    assert torch.equal(attnkit_names, by_name)  # attnkit's names, in attnkit's layout
    assert (by_name - plain).abs().max() > 1e-3


def test_a_predicate_hooks_each_point_once(model):
    seen = []
    with torch.no_grad():
        model.run_with_hooks(
            _ids(model),
            fwd_hooks=[(lambda name: "hook_z" in name or name.endswith(".z"), lambda z, hook: seen.append(hook.name))],
        )
    assert seen == [get_act_name("z", layer) for layer in range(model.num_layers)]


def test_tl_bwd_hooks_as_written(model):
    ids = _ids(model)
    grads = {}

    def keep(grad, hook):
        grads[hook.name] = grad.clone()

    run = model.run_with_hooks(ids, bwd_hooks=[(get_act_name("z", 1), keep)])
    run.logits[0, -1].sum().backward()
    _, cache = model.run_with_cache(
        ids, incl_bwd=True, names_filter="blocks.1.attn.hook_z", metric=lambda logits: logits[0, -1].sum()
    )
    torch.testing.assert_close(grads["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_z_grad"], rtol=0, atol=1e-6)


def test_hooks_given_twice_or_not_as_pairs_are_refused(model):
    ids = _ids(model)
    with pytest.raises(TypeError, match="fwd_hooks= is TransformerLens' spelling of hooks="):
        model.run_with_hooks(
            ids, hooks={get_act_name("z", 1): _tl_zero_head}, fwd_hooks=[(get_act_name("z", 1), _tl_zero_head)]
        )
    with pytest.raises(TypeError, match=r"a \(name or predicate, function\) pair"):
        model.run_with_hooks(ids, fwd_hooks=[get_act_name("z", 1)])
    with pytest.raises(ValueError, match="unknown hook name 'blocks.1.attn.hook_nothing'"):
        model.run_with_hooks(ids, fwd_hooks=[("blocks.1.attn.hook_nothing", _tl_zero_head)])
