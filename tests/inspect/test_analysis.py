"""Rollout, flow, value- and gradient-weighted attention, head ablation and activation
patching on attnkit's SmolLM2 and MiniLM, each against a computation written here from
transformers on the same weights (its attentions, and forward hooks on its modules)."""

from __future__ import annotations

import warnings

import networkx as nx
import pytest
import torch

from attnkit.inspect import interventions, methods
from attnkit.inspect.names import FLOW_MAX_TOKENS

pytestmark = pytest.mark.slow

SMOLLM2_TEXT = "The capital of France is"
MINILM_TEXT = "The cat sat on the mat."
MAP_ATOL = 1e-5
EFFECT_ATOL = 1e-4
# SmolLM2 heads rerun in transformers (each one full forward pass there); attnkit computes all.
CHECKED_HEADS = (0, 4, 8)


def assert_close_to_scale(ours, expected, what):
    """Within 1e-5 of the map's largest value: value-weighted maps are norms of residual
    stream vectors (up to ~15 in SmolLM2), where float32 itself resolves ~1e-6."""
    error, scale = (ours.double() - expected).abs().max().detach(), expected.abs().max().detach()
    assert error <= MAP_ATOL * max(1.0, float(scale)), f"{what}: error {float(error):.3g} at scale {float(scale):.3g}"


# --- references from transformers -------------------------------------------------------


def hf_attentions(hf_model, ids):
    """Every layer's weights ``[L, h, s, s]`` from transformers' eager attention."""
    with torch.no_grad():
        out = hf_model(ids, output_attentions=True)
    return torch.cat(out.attentions).double()


def reference_rollout(attentions, residual_weight=0.5, reduce=lambda w: w.mean(0)):
    s = attentions.shape[-1]
    result, rollouts = None, []
    for layer_weights in attentions:
        a = residual_weight * torch.eye(s, dtype=torch.float64) + (1 - residual_weight) * reduce(layer_weights)
        a = a / a.sum(-1, keepdim=True)
        result = a if result is None else a @ result
        rollouts.append(result)
    return torch.stack(rollouts)


def reference_flow(attentions, layer):
    """Maximum flow with networkx's Edmonds-Karp on the layer graph, one pair at a time."""
    s = attentions.shape[-1]
    graph = nx.DiGraph()
    for lyr in range(layer + 1):
        a = 0.5 * attentions[lyr].mean(0) + 0.5 * torch.eye(s, dtype=torch.float64)
        a = a / a.sum(-1, keepdim=True)
        for i in range(s):
            for j in range(s):
                graph.add_edge(f"{lyr}:{j}", f"{lyr + 1}:{i}", capacity=float(a[i, j]))
    flow = torch.zeros(s, s, dtype=torch.float64)
    for i in range(s):
        for j in range(s):
            flow[i, j] = nx.maximum_flow_value(
                graph, f"0:{j}", f"{layer + 1}:{i}", flow_func=nx.algorithms.flow.edmonds_karp
            )
    return flow


def llama_parts(hf_model, layer):
    attn = hf_model.model.layers[layer].self_attn
    return attn, attn.v_proj, attn.o_proj


def bert_parts(hf_model, layer):
    attention = hf_model.encoder.layer[layer].attention
    return attention.self, attention.self.value, attention.output.dense


def hf_value_weighted(hf_model, ids, parts, num_heads):
    """Per head ``α_ij ‖(x_j W_V^h + b_V^h) W_O^h‖`` and ``‖Σ_h α_ij f_h(x_j)‖``, with ``x``
    the input of each layer's self-attention, read by a forward pre-hook."""
    layers = len(parts)
    inputs = {}
    handles = []
    for layer, (attn, _, _) in enumerate(parts):

        def keep(module, args, kwargs, layer=layer):
            inputs[layer] = (kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]).double()

        handles.append(attn.register_forward_pre_hook(keep, with_kwargs=True))
    try:
        alphas = hf_attentions(hf_model, ids)  # [L, h, s, s]
    finally:
        for handle in handles:
            handle.remove()
    per_head, summed = [], []
    for layer in range(layers):
        _, v_proj, o_proj = parts[layer]
        x = inputs[layer][0]  # [s, e]
        v = x @ v_proj.weight.double().T + (0 if v_proj.bias is None else v_proj.bias.double())  # [s, h_kv * d]
        d = o_proj.weight.shape[1] // num_heads
        h_kv = v.shape[1] // d
        sent = []
        for h in range(num_heads):
            kv = h // (num_heads // h_kv)
            sent.append(v[:, kv * d : (kv + 1) * d] @ o_proj.weight.double()[:, h * d : (h + 1) * d].T)  # [s, e]
        sent = torch.stack(sent)  # [h, s, e]
        alpha = alphas[layer]  # [h, s, s]
        per_head.append(alpha * sent.norm(dim=-1)[:, None, :])
        summed.append(torch.einsum("hij,hje->ije", alpha, sent).norm(dim=-1))
    return per_head, summed


def hf_run_with_z(hf_model, ids, o_proj, edit):
    """Run with ``edit(z)`` applied to the input of one layer's output projection (the
    heads' outputs side by side, ``[1, s, h * d]``)."""

    def pre(module, args):
        return (edit(args[0].clone()),)

    handle = o_proj.register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return hf_model(ids)
    finally:
        handle.remove()


def zero_head(head, d):
    def edit(z):
        z[..., head * d : (head + 1) * d] = 0
        return z

    return edit


def set_head(head, d, value):
    def edit(z):
        z[..., head * d : (head + 1) * d] = value[..., head * d : (head + 1) * d]
        return z

    return edit


def read_z(hf_model, ids, o_proj):
    seen = {}

    def edit(z):
        seen["z"] = z.clone()
        return z

    out = hf_run_with_z(hf_model, ids, o_proj, edit)
    return seen["z"], out


def hf_embedding(out):
    return out.last_hidden_state[0].double().mean(0)


# --- SmolLM2 ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_ids(hf_smollm2):
    _, tokenizer = hf_smollm2
    return tokenizer(SMOLLM2_TEXT, return_tensors="pt").input_ids


def test_rollout_matches_transformers_smollm2(smollm2, hf_smollm2, smollm2_ids):
    attentions = hf_attentions(hf_smollm2[0], smollm2_ids)
    ours = methods.rollout(smollm2, SMOLLM2_TEXT)
    assert ours.shape == (30, 5, 5)
    assert (ours.double() - reference_rollout(attentions)).abs().max() < MAP_ATOL
    other = methods.rollout(smollm2, SMOLLM2_TEXT, head_reduction="max", residual_weight=0.3)
    expected = reference_rollout(attentions, 0.3, lambda w: w.amax(0))
    assert (other.double() - expected).abs().max() < MAP_ATOL
    assert torch.allclose(ours.sum(-1), torch.ones(30, 5), atol=1e-5)


def test_flow_matches_networkx_on_transformers_attention_smollm2(smollm2, hf_smollm2, smollm2_ids):
    attentions = hf_attentions(hf_smollm2[0], smollm2_ids)
    ours = methods.flow(smollm2, SMOLLM2_TEXT, layer=4)
    expected = reference_flow(attentions, layer=4)
    assert (ours.double() - expected).abs().max() < 1e-4
    assert ours.triu(1).abs().max() == 0  # causal: no flow from later tokens


def test_value_weighted_matches_transformers_smollm2(smollm2, hf_smollm2, smollm2_ids):
    hf_model = hf_smollm2[0]
    parts = [llama_parts(hf_model, layer) for layer in range(30)]
    per_head, summed = hf_value_weighted(hf_model, smollm2_ids, parts, num_heads=9)
    ours = methods.value_weighted(smollm2, SMOLLM2_TEXT, layers=[0, 13, -1])
    assert sorted(ours.heads) == [0, 13, 29]
    for layer in (0, 13, 29):
        assert ours.heads[layer].shape == (9, 5, 5) and ours.summed[layer].shape == (5, 5)
        assert_close_to_scale(ours.heads[layer], per_head[layer], f"layer {layer} per head")
        assert_close_to_scale(ours.summed[layer], summed[layer], f"layer {layer} summed")


def test_gradient_weighted_matches_transformers_smollm2(smollm2, hf_smollm2, smollm2_ids):
    hf_model, tokenizer = hf_smollm2
    target = tokenizer(" Paris").input_ids[0]
    out = hf_model(smollm2_ids, output_attentions=True)
    for weights in out.attentions:
        weights.retain_grad()
    torch.log_softmax(out.logits[0, -1], -1)[target].backward()
    hf_model.zero_grad(set_to_none=True)
    ours = methods.gradient_weighted(smollm2, SMOLLM2_TEXT, " Paris", layers=[2, 29])
    for layer in (2, 29):
        expected = (out.attentions[layer] * out.attentions[layer].grad)[0]
        assert (ours[layer] - expected).abs().max() < 1e-4, layer
    assert ours[29].abs().max() > 1e-3


def test_zero_ablation_matches_transformers_smollm2(smollm2, hf_smollm2, smollm2_ids):
    hf_model, tokenizer = hf_smollm2
    target = tokenizer(" Paris").input_ids[0]
    ours = interventions.head_ablation(smollm2, SMOLLM2_TEXT, target=" Paris", layers=[3, -1])
    assert ours.layers == [3, 29] and ours.effects.shape == (2, 9)
    with torch.no_grad():
        clean = torch.log_softmax(hf_model(smollm2_ids).logits[0, -1], -1)[target]
    assert abs(ours.baseline - float(clean)) < EFFECT_ATOL
    for row, layer in enumerate((3, 29)):
        o_proj = llama_parts(hf_model, layer)[2]
        for head in CHECKED_HEADS:
            out = hf_run_with_z(hf_model, smollm2_ids, o_proj, zero_head(head, 64))
            expected = torch.log_softmax(out.logits[0, -1], -1)[target] - clean
            assert abs(float(ours.effects[row, head]) - float(expected)) < EFFECT_ATOL, (layer, head)


def test_mean_ablation_matches_transformers_smollm2(smollm2, hf_smollm2, smollm2_ids):
    hf_model, tokenizer = hf_smollm2
    target = tokenizer(" Paris").input_ids[0]
    reference = ["A cat.", "Dogs bark at night"]
    ours = interventions.head_ablation(smollm2, SMOLLM2_TEXT, target=" Paris", mean_over=reference, layers=[5])
    o_proj = llama_parts(hf_model, 5)[2]
    seen = [read_z(hf_model, tokenizer(t, return_tensors="pt").input_ids, o_proj)[0][0] for t in reference]
    mean = torch.cat(seen).mean(0)  # [h * d]
    with torch.no_grad():
        clean = torch.log_softmax(hf_model(smollm2_ids).logits[0, -1], -1)[target]
    for head in CHECKED_HEADS:
        out = hf_run_with_z(hf_model, smollm2_ids, o_proj, set_head(head, 64, mean))
        expected = torch.log_softmax(out.logits[0, -1], -1)[target] - clean
        assert abs(float(ours.effects[0, head]) - float(expected)) < EFFECT_ATOL, head
    assert ours.replacement == "mean"


def test_patching_matches_transformers_smollm2(smollm2, hf_smollm2):
    hf_model, tokenizer = hf_smollm2
    clean, corrupt = "Mary went home and John gave a book to", "John went home and Mary gave a book to"
    ours = interventions.activation_patching(smollm2, clean, corrupt, target=" Mary", wrong=" John", layers=[10, 29])
    ids_clean = tokenizer(clean, return_tensors="pt").input_ids
    ids_corrupt = tokenizer(corrupt, return_tensors="pt").input_ids
    t, w = tokenizer(" Mary").input_ids[0], tokenizer(" John").input_ids[0]

    def difference(out):
        return float(out.logits[0, -1, t] - out.logits[0, -1, w])

    with torch.no_grad():
        clean_diff, corrupt_diff = difference(hf_model(ids_clean)), difference(hf_model(ids_corrupt))
    assert abs(ours.baseline["clean"] - clean_diff) < EFFECT_ATOL
    assert abs(ours.baseline["corrupt"] - corrupt_diff) < EFFECT_ATOL
    for row, layer in enumerate((10, 29)):
        o_proj = llama_parts(hf_model, layer)[2]
        clean_z, _ = read_z(hf_model, ids_clean, o_proj)
        for head in CHECKED_HEADS:
            patched = difference(hf_run_with_z(hf_model, ids_corrupt, o_proj, set_head(head, 64, clean_z)))
            expected = (patched - corrupt_diff) / (clean_diff - corrupt_diff)
            assert abs(float(ours.effects[row, head]) - expected) < EFFECT_ATOL, (layer, head)


# --- MiniLM ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_ids(hf_minilm):
    _, tokenizer = hf_minilm
    return tokenizer(MINILM_TEXT, return_tensors="pt").input_ids


def test_rollout_matches_transformers_minilm(minilm, hf_minilm, minilm_ids):
    attentions = hf_attentions(hf_minilm[0], minilm_ids)
    ours = methods.rollout(minilm, MINILM_TEXT)
    assert ours.shape == (6, 9, 9)
    assert (ours.double() - reference_rollout(attentions)).abs().max() < MAP_ATOL


def test_flow_matches_networkx_on_transformers_attention_minilm(minilm, hf_minilm):
    _, tokenizer = hf_minilm
    text = "cats sleep a lot"
    ids = tokenizer(text, return_tensors="pt").input_ids
    attentions = hf_attentions(hf_minilm[0], ids)
    ours = methods.flow(minilm, text, layer=2)
    assert (ours.double() - reference_flow(attentions, layer=2)).abs().max() < 1e-4


def test_value_weighted_matches_transformers_minilm(minilm, hf_minilm, minilm_ids):
    hf_model = hf_minilm[0]
    parts = [bert_parts(hf_model, layer) for layer in range(6)]
    per_head, summed = hf_value_weighted(hf_model, minilm_ids, parts, num_heads=12)
    ours = methods.value_weighted(minilm, MINILM_TEXT)
    for layer in range(6):
        assert_close_to_scale(ours.heads[layer], per_head[layer], f"layer {layer} per head")
        assert_close_to_scale(ours.summed[layer], summed[layer], f"layer {layer} summed")


def test_gradient_weighted_matches_transformers_minilm(minilm, hf_minilm, minilm_ids):
    hf_model, tokenizer = hf_minilm
    with torch.no_grad():
        reference = hf_embedding(hf_model(tokenizer("a kitten", return_tensors="pt").input_ids))
    out = hf_model(minilm_ids, output_attentions=True)
    for weights in out.attentions:
        weights.retain_grad()
    torch.nn.functional.cosine_similarity(hf_embedding(out), reference, dim=0).backward()
    hf_model.zero_grad(set_to_none=True)
    ours = methods.gradient_weighted(minilm, MINILM_TEXT, "a kitten", layers=[0, 5])
    for layer in (0, 5):
        expected = (out.attentions[layer] * out.attentions[layer].grad)[0]
        assert (ours[layer] - expected).abs().max() < 1e-4, layer


def test_ablation_matches_transformers_minilm(minilm, hf_minilm, minilm_ids):
    hf_model = hf_minilm[0]
    ours = interventions.head_ablation(minilm, MINILM_TEXT, layers=[0, 5])
    with torch.no_grad():
        clean = hf_embedding(hf_model(minilm_ids))
    for row, layer in enumerate((0, 5)):
        dense = bert_parts(hf_model, layer)[2]
        for head in range(12):
            ablated = hf_embedding(hf_run_with_z(hf_model, minilm_ids, dense, zero_head(head, 32)))
            expected = torch.nn.functional.cosine_similarity(ablated, clean, dim=0) - 1
            assert abs(float(ours.effects[row, head]) - float(expected)) < EFFECT_ATOL, (layer, head)


def test_patching_matches_transformers_minilm(minilm, hf_minilm):
    hf_model, tokenizer = hf_minilm
    clean, corrupt = "The cat sat on the mat.", "The dog sat on the mat."
    ours = interventions.activation_patching(minilm, clean, corrupt, layers=[1])
    ids_clean = tokenizer(clean, return_tensors="pt").input_ids
    ids_corrupt = tokenizer(corrupt, return_tensors="pt").input_ids
    dense = bert_parts(hf_model, 1)[2]
    clean_z, clean_out = read_z(hf_model, ids_clean, dense)
    clean_embedding = hf_embedding(clean_out)
    with torch.no_grad():
        corrupt_cos = torch.nn.functional.cosine_similarity(hf_embedding(hf_model(ids_corrupt)), clean_embedding, dim=0)
    for head in range(12):
        patched = hf_embedding(hf_run_with_z(hf_model, ids_corrupt, dense, set_head(head, 32, clean_z)))
        cos = torch.nn.functional.cosine_similarity(patched, clean_embedding, dim=0)
        expected = (cos - corrupt_cos) / (1 - corrupt_cos)
        assert abs(float(ours.effects[0, head]) - float(expected)) < EFFECT_ATOL, head


# --- errors ----------------------------------------------------------------------------


def test_target_that_is_not_one_token_says_how_it_tokenises(smollm2):
    with pytest.raises(
        ValueError,
        match=r"the target ' Parisians' must be a single token of smollm2, but it "
        r"tokenises as 'ĠParis' \+ 'ians' \(2 tokens\)",
    ):
        interventions.head_ablation(smollm2, SMOLLM2_TEXT, target=" Parisians", layers=[0])
    with pytest.raises(ValueError, match=r"a word after a space is its own token with the space: ' Parisians'"):
        methods.gradient_weighted(smollm2, SMOLLM2_TEXT, "Parisians")
    with pytest.raises(ValueError, match="smollm2 is causal: give the target token"):
        interventions.head_ablation(smollm2, SMOLLM2_TEXT, layers=[0])


def test_clean_and_corrupt_of_different_lengths_are_refused(smollm2):
    with pytest.raises(ValueError, match=r"same number of tokens, got 5 \('The' 'Ġcapital' .*\) and 6 \("):
        interventions.activation_patching(
            smollm2, SMOLLM2_TEXT, "The capital city of France is", target=" Paris", wrong=" Rome"
        )


def test_encoders_take_no_target_token(minilm):
    with pytest.raises(ValueError, match="minilm is a bidirectional encoder .* takes no target token"):
        interventions.head_ablation(minilm, MINILM_TEXT, target="cat")


def test_flow_above_its_limit_is_refused(minilm):
    text = " ".join(["word"] * FLOW_MAX_TOKENS)
    with pytest.raises(
        ValueError,
        match=rf"takes at most {FLOW_MAX_TOKENS} tokens, got {FLOW_MAX_TOKENS + 2}; "
        "use rollout for longer texts",
    ):
        methods.flow(minilm, text)


def test_a_target_without_its_leading_space_is_warned_about(smollm2):
    # " Paris" is the likely next token; "Paris" (another token) is not.
    with pytest.warns(
        UserWarning, match=r"the target 'Paris' is not among the 10 likeliest .*did you mean ' Paris'\?"
    ) as ablation:
        interventions.head_ablation(smollm2, SMOLLM2_TEXT, target="Paris", layers=[0])
    with pytest.warns(UserWarning, match="did you mean ' Paris'") as gradient:
        methods.gradient_weighted(smollm2, SMOLLM2_TEXT, "Paris", layers=[29])
    # The warning names the caller's line (here), however deep inside attnkit it is raised.
    assert [record.filename for record in (*ablation, *gradient)] == [__file__, __file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interventions.head_ablation(smollm2, SMOLLM2_TEXT, target=" Paris", layers=[0])
