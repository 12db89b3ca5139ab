"""The hook, ablation and value-weighted suite, once for every decoder family (tiny random
checkpoints of tests/fixtures/tiny_families.py): hooks that change nothing change nothing,
hooks equal transformers' forward hooks on the same modules, zeroing a head's z equals
the head ablation, value-weighted attention equals the one computed from transformers'
own projections."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import models
from attnkit.inspect import interventions, methods
from tests.fixtures.tiny_families import CASES, MOE_CASES
from tests.inspect.test_analysis import assert_close_to_scale, hf_value_weighted

transformers = pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"
TARGET = "w5"


# Value-weighted attention reads each head's value projection: latent attention has none
# (its values come out of the latent).
_WITH_VALUE_PROJECTIONS = sorted(CASES) + ["mixtral", "qwen2_moe", "qwen3_moe"]


def _pair(folder):
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return models.load(folder), hf


@pytest.fixture(scope="module", params=sorted(CASES | MOE_CASES))
def pair(request, tiny_family_folder):
    """``(attnkit model, transformers model with eager attention)`` of one family."""
    return _pair(tiny_family_folder(request.param))


@pytest.fixture(scope="module", params=_WITH_VALUE_PROJECTIONS)
def value_pair(request, tiny_family_folder):
    """:func:`pair` of a family whose attention projects values from the layer input."""
    return _pair(tiny_family_folder(request.param))


def _hf_layers(hf) -> nn.ModuleList:
    base = hf.base_model
    return base.layers if hasattr(base, "layers") else base.h


def _hf_attention(layer: nn.Module) -> nn.Module:
    return next(getattr(layer, name) for name in ("self_attn", "attn", "attention") if hasattr(layer, name))


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def test_identity_hooks_leave_logits_identical(pair):
    model, _ = pair
    plain = model.run(TEXT, return_weights=False)
    names = [name for name in model.hook_names() if not name.endswith(("pattern", "scores"))]
    with model.hooks({name: (lambda t: None) for name in names}):
        hooked = model.run(TEXT, return_weights=False)
    assert torch.equal(plain.logits, hooked.logits)
    with_weights = model.run(TEXT)
    with model.hooks({name: (lambda t: t) for name in model.hook_names()}):
        hooked = model.run(TEXT)
    assert torch.equal(with_weights.logits, hooked.logits)


def test_hooks_equal_transformers_forward_hooks(pair):
    model, hf = pair
    ids = model.tokenize(TEXT).ids
    theirs: dict[str, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(_hf_layers(hf)):
        # The attention block's output, after Gemma's norm of it where the family has one.
        attention_out = layer.post_attention_layernorm if model.config.output_norms else _hf_attention(layer)
        for name, module in ((f"resid_post{i}", layer), (f"attn_out{i}", attention_out)):
            keep = lambda m, a, out, name=name: theirs.__setitem__(name, _first(out))  # noqa: E731
            handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for handle in handles:
            handle.remove()
    names = [model.hook_name(kind, i) for i in range(model.num_layers) for kind in ("resid_post", "attn_out")]
    cache = model.run(ids, return_weights=False, names_filter=names).cache
    for i in range(model.num_layers):
        for kind, key in (("resid_post", f"resid_post{i}"), ("attn_out", f"attn_out{i}")):
            ours, expected = cache[model.hook_name(kind, i)], theirs[key]
            assert (ours - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max())), (kind, i)


def test_a_hook_that_zeroes_a_heads_z_equals_the_ablation(pair):
    model, _ = pair
    ablation = interventions.head_ablation(model, TEXT, target=TARGET, layers=[1])
    plain = model.run(TEXT, return_weights=False)
    target_id = model.tokenize(TARGET).ids[0, 0]
    effects = []
    for head in (0, model.num_heads - 1):

        def zero(z, head=head):
            z = z.clone()
            z[:, head] = 0
            return z

        with model.hooks({model.hook_name("z", 1): zero}):
            ablated = model.run(TEXT, return_weights=False)
        effect = (torch.log_softmax(ablated.logits[0, -1], -1) - torch.log_softmax(plain.logits[0, -1], -1))[target_id]
        assert abs(float(effect) - float(ablation.effects[0, head])) < 1e-5, head
        effects.append(float(effect))
    assert any(effect != 0.0 for effect in effects)


def _value_output_parts(hf, model, layer: int) -> tuple[nn.Module, nn.Linear, nn.Linear]:
    """transformers' attention module of ``layer`` and its value and output projections as
    ``nn.Linear`` (cut out of the fused matrices of GPT-2, GPT-NeoX and Phi-3)."""
    attn = _hf_attention(_hf_layers(hf)[layer])
    h, d, h_kv, e = model.num_heads, model.config.head_dim, model.num_kv_heads, model.config.hidden_size

    def linear(weight, bias=None) -> nn.Linear:
        out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        out.weight = nn.Parameter(weight.detach().clone())
        if bias is not None:
            out.bias = nn.Parameter(bias.detach().clone())
        return out

    if hasattr(attn, "v_proj"):
        return attn, attn.v_proj, attn.o_proj
    if hasattr(attn, "c_attn"):  # GPT-2's Conv1D [in, out]
        return (
            attn,
            linear(attn.c_attn.weight[:, 2 * e :].T, attn.c_attn.bias[2 * e :]),
            linear(attn.c_proj.weight.T, attn.c_proj.bias),
        )
    if hasattr(attn, "query_key_value"):  # GPT-NeoX: rows grouped by head, [h, 3, d]
        fused = attn.query_key_value
        weight = fused.weight.view(h, 3, d, e)[:, 2].reshape(h * d, e)
        return attn, linear(weight, fused.bias.view(h, 3, d)[:, 2].reshape(h * d)), attn.dense
    rows = h * d + h_kv * d  # Phi-3: query rows, key rows, value rows
    return attn, linear(attn.qkv_proj.weight[rows:]), attn.o_proj


def test_value_weighted_matches_transformers(value_pair):
    model, hf = value_pair
    ids = model.tokenize(TEXT).ids
    parts = [_value_output_parts(hf, model, layer) for layer in range(model.num_layers)]
    per_head, summed = hf_value_weighted(hf, ids, parts, num_heads=model.num_heads)
    ours = methods.value_weighted(model, TEXT)
    for layer in range(model.num_layers):
        assert_close_to_scale(ours.heads[layer], per_head[layer], f"layer {layer} per head")
        assert_close_to_scale(ours.summed[layer], summed[layer], f"layer {layer} summed")
