"""The mixture-of-experts and latent-attention families against transformers on tiny
random checkpoints (tests/fixtures/tiny_families.py): the router's choices and weights in
every routing layer, the latent as transformers forms it, expert ablation, and the size of
the latent KV cache."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.nn import ablate_experts
from tests.fixtures.tiny_families import MOE_CASES

transformers = pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"


@pytest.fixture(scope="module", params=sorted(MOE_CASES))
def pair(request, tiny_family_folder):
    """``(attnkit model, transformers model)`` of one mixture-of-experts family."""
    folder = tiny_family_folder(request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return models.load(folder), hf


def _hf_routers(hf) -> dict[int, torch.nn.Module]:
    """Layer → transformers' router module, in the layers that route."""
    routers = {}
    for i, layer in enumerate(hf.model.layers):
        block = getattr(layer, "block_sparse_moe", None) or layer.mlp
        if hasattr(block, "gate") and hasattr(block, "experts"):
            routers[i] = block.gate
    return routers


def _routing_layers(model) -> list[int]:
    return [i for i, routes in enumerate(model.config.experts.layers) if routes]


def test_router_choices_and_weights_equal_transformers(pair):
    model, hf = pair
    ids = model.tokenize(TEXT).ids
    theirs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = [
        router.register_forward_hook(lambda m, a, out, i=i: theirs.__setitem__(i, (out[2], out[1])))
        for i, router in _hf_routers(hf).items()
    ]
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for handle in handles:
            handle.remove()
    layers = _routing_layers(model)
    assert sorted(theirs) == layers and layers
    kinds = ("chosen_experts", "expert_weights")
    cache = model.run(
        ids, return_weights=False, names_filter=[model.hook_name("ff." + k, i) for i in layers for k in kinds]
    ).cache
    for i in layers:
        indices, weights = theirs[i]  # [s, k] each
        chosen = cache[model.hook_name("ff.chosen_experts", i)][0]  # [s, k]
        assert torch.equal(chosen.sort(-1).values, indices.sort(-1).values), i
        dense = torch.zeros(indices.shape[0], model.config.experts.router.num_experts).scatter(
            -1, indices, weights.float()
        )
        torch.testing.assert_close(cache[model.hook_name("ff.expert_weights", i)][0], dense, rtol=0, atol=1e-5)
    # The tokens do not all go to the same experts: the choice is exercised.
    first = cache[model.hook_name("ff.chosen_experts", layers[0])][0].sort(-1).values
    assert len({tuple(row.tolist()) for row in first}) > 1


def test_ablating_an_expert_equals_zeroing_its_weights_in_transformers(pair):
    model, hf = pair
    ids = model.tokenize(TEXT).ids
    layer = _routing_layers(model)[-1]
    cache = model.run(ids, return_weights=False, names_filter=[model.hook_name("ff.chosen_experts", layer)]).cache
    expert = int(cache[model.hook_name("ff.chosen_experts", layer)][0, 0, 0])  # used by the first token
    with model.hooks({model.hook_name("ff.expert_weights", layer): ablate_experts([expert])}):
        ablated = model.run(ids, return_weights=False).logits
    block = getattr(hf.model.layers[layer], "block_sparse_moe", None) or hf.model.layers[layer].mlp
    with torch.no_grad():
        # An expert whose output projection is zero adds nothing, whatever its weight.
        down = block.experts.down_proj if isinstance(block.experts.down_proj, torch.nn.Parameter) else None
        if down is not None:
            down[expert].zero_()
        else:
            block.experts[expert].down_proj.weight.zero_()
        expected = hf(ids).logits
    assert (ablated - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert not torch.allclose(ablated, model.run(ids, return_weights=False).logits)


def test_a_replaced_router_score_changes_the_choice(pair):
    model, _ = pair
    layer = _routing_layers(model)[0]
    names = [model.hook_name("ff.chosen_experts", layer)]

    def favour_last(scores):
        scores = scores.clone()
        scores[..., -1] = 10.0
        return scores

    with model.hooks({model.hook_name("ff.router_scores", layer): favour_last}):
        cache = model.run(TEXT, return_weights=False, names_filter=names).cache
    last = model.config.experts.router.num_experts - 1
    assert (cache[names[0]][0] == last).any(-1).all()


def test_the_latent_is_transformers_normalised_kv_latent(tiny_family_folder):
    folder = tiny_family_folder("deepseek_v3")
    model = models.load(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = model.tokenize(TEXT).ids
    theirs = {}
    handles = [
        layer.self_attn.kv_a_layernorm.register_forward_hook(lambda m, a, out, i=i: theirs.__setitem__(i, out))
        for i, layer in enumerate(hf.model.layers)
    ]
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for handle in handles:
            handle.remove()
    names = [model.hook_name("self_attn.latent", i) for i in range(model.num_layers)]
    cache = model.run(ids, return_weights=False, names_filter=names).cache
    for i, name in enumerate(names):
        torch.testing.assert_close(cache[name], theirs[i], rtol=0, atol=1e-5)


def test_the_latent_cache_holds_the_latent_and_the_rotary_key_only(tiny_family_folder):
    model = models.load(tiny_family_folder("deepseek_v3"))
    latent = model.config.latent_attention
    ids = model.tokenize(TEXT).ids
    cache = model.module.new_kv_cache()
    with torch.no_grad():
        model.module(ids, kv_cache=cache)
    layer = cache.self_attention[0]
    assert layer.keys.shape == (1, 1, ids.shape[1], latent.kv_lora_rank)
    assert layer.values.shape == (1, 1, ids.shape[1], latent.qk_rope_head_dim)
    # Per token and layer: r + d_r numbers, where multi-head attention of the same heads
    # keeps 2 · h · d (keys of d_n + d_r, values of d_v).
    per_token = layer.keys.shape[-1] + layer.values.shape[-1]
    full = model.num_heads * (latent.qk_head_dim + latent.v_head_dim)
    assert per_token == latent.cached_numbers_per_token() == 24 and full == 144


def test_the_lens_refuses_matrices_these_blocks_do_not_have(tiny_family_folder):
    deepseek = models.load(tiny_family_folder("deepseek_v3"))
    for name in ("W_Q", "W_K", "W_V", "b_K"):
        with pytest.raises(ValueError, match="multi-head latent attention: .* self_attn.latent"):
            getattr(deepseek, name)
    mixtral = models.load(tiny_family_folder("mixtral"))
    assert mixtral.W_V.shape == (mixtral.num_layers, 2, 64, 16)
    for name in ("W_in", "W_out", "b_in"):
        with pytest.raises(ValueError, match=r"mixture of experts in layers \[0, 1\].*ff.chosen_experts"):
            getattr(mixtral, name)
