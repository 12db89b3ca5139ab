"""Long-context summaries (attnkit.inspect.long_context) against the same statistics of the
dense weights: the model's own ``[h, s, s]`` map in float64, on tiny random checkpoints of
families with sliding windows, grouped-query attention and soft-capping, and on SmolLM2."""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
from torch import Tensor

from attnkit import models
from attnkit.inspect.long_context import (
    LayerScoring,
    distance_quantiles,
    exact_block,
    layer_scoring,
    long_context_summaries,
    summarize_layer,
)
from attnkit.inspect.long_context_blocks import TOP_CHUNK
from tests.fixtures.tiny_families import TEXT_LENGTH, VOCAB
from tests.functional.dense_reference import LargestStorage

# gemma2: sliding window on alternate layers, soft-capping, GQA; gemma3_text: local and
# global layers, q/k norms, MQA; mistral: a window on every layer; qwen2: a window on some.
FAMILIES = ("gemma2", "gemma3_text", "mistral", "qwen2", "llama_llama3")


def dense_statistics(weights: Tensor, *, sink_tokens: int, window: int) -> dict[str, Tensor]:
    """Per-query statistics of dense causal weights ``[h, s, s]``, computed the plain way."""
    _, s, _ = weights.shape
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    dist = (i - j).clamp(min=0)
    w = weights.double()
    # Mass at distance t over the queries 1 .. s-1: the diagonal of keys i - t.
    below = w[:, 1:, :]  # row r is query r + 1
    mass = torch.stack([torch.diagonal(below, offset=1 - t, dim1=1, dim2=2).sum(-1) for t in range(s)], dim=-1)
    return {
        "sink": w[..., :sink_tokens].sum(-1),
        "distance": (w * dist).sum(-1),
        "within_window": (w * (dist < window)).sum(-1),
        "entropy": -torch.special.xlogy(w, w).sum(-1) / math.log(2),
        "distance_mass": mass / (s - 1),
    }


def _patterns(model: models.Model) -> list[str]:
    return [model.hook_name("self_attn.pattern", i) for i in range(model.num_layers)]


def _pattern(model: models.Model, run: models.ModelRun, layer: int) -> Tensor:
    """Layer ``layer``'s weights ``[h, s, s]`` as the model computed them (its dtype)."""
    return run.cache[model.hook_name("self_attn.pattern", layer)][0]


def _double(model: models.Model) -> models.Model:
    twin = copy.copy(model)
    twin.module = copy.deepcopy(model.module).double()
    return twin


@pytest.mark.parametrize("family", FAMILIES)
def test_summaries_equal_dense_statistics_on_tiny_families(family, tiny_family_folder):
    model = _double(models.load(tiny_family_folder(family)))
    ids = torch.randint(0, VOCAB - 1, (TEXT_LENGTH,), generator=torch.Generator().manual_seed(1))
    dense = model.run(ids, return_weights=False, logits=True, names_filter=_patterns(model))
    got = long_context_summaries(
        model, ids, top_k=4, sink_tokens=2, window=5, map_block=3, logits_at=[0, 7, TEXT_LENGTH - 1], block_budget=40
    )
    assert sorted(got.summaries) == list(range(model.num_layers))
    for layer, summary in got.summaries.items():
        weights = _pattern(model, dense, layer)  # [h, s, s]
        expected = dense_statistics(weights, sink_tokens=2, window=5)
        for name, value in expected.items():
            torch.testing.assert_close(
                getattr(summary, name), value, rtol=1e-10, atol=1e-12, msg=f"{family} {layer} {name}"
            )
        top_w, top_i = weights.topk(4, dim=-1)  # [h, s, 4]
        present = top_w > 0
        torch.testing.assert_close(summary.top_weights, torch.where(present, top_w, 0.0), rtol=1e-10, atol=1e-12)
        assert torch.equal(summary.top_keys, torch.where(present, top_i, -1)), f"{family} layer {layer}"
        padded = torch.nn.functional.pad(weights, (0, 1, 0, 1)).reshape(-1, 7, 3, 7, 3)  # 20 -> 21 = 7 blocks of 3
        torch.testing.assert_close(summary.block_max, padded.amax(dim=(2, 4)), rtol=1e-10, atol=1e-12)
        sizes = torch.tensor([3.0] * 6 + [2.0], dtype=torch.float64)
        mean = padded.sum(dim=(2, 4)) / (sizes[:, None] * sizes[None, :])
        torch.testing.assert_close(summary.block_mean, mean, rtol=1e-10, atol=1e-12)
    assert got.kept_qk == {}  # kept only when asked
    torch.testing.assert_close(got.logits, dense.logits[0, [0, 7, TEXT_LENGTH - 1]].float(), rtol=1e-5, atol=1e-5)


def test_heads_rows_and_exact_blocks_of_a_soft_capped_windowed_layer(tiny_family_folder):
    model = _double(models.load(tiny_family_folder("gemma2")))
    ids = torch.randint(0, VOCAB - 1, (TEXT_LENGTH,), generator=torch.Generator().manual_seed(2))
    dense = model.run(ids, return_weights=False, logits=False, names_filter=_patterns(model))
    got = long_context_summaries(model, ids, layers=[0, -1], heads=[3, 1], rows=[19, 4, 11], top_k=2, keep_qk=True)
    assert sorted(got.summaries) == [0, 2]
    for layer in (0, 2):
        full = _pattern(model, dense, layer)  # [h, s, s]
        weights = full[[3, 1]][:, [4, 11, 19]]  # [2, 3, s]
        summary = got.summaries[layer]
        assert summary.rows.tolist() == [4, 11, 19]
        torch.testing.assert_close(summary.top_weights, weights.topk(2, dim=-1).values, rtol=1e-10, atol=1e-12)
        q, k = got.kept_qk[layer]
        block = exact_block(q, k, got.scorings[layer], head=1, rows=(5, 17), keys=(2, 9))
        torch.testing.assert_close(block, full[1, 5:17, 2:9], rtol=1e-10, atol=1e-12)
    assert got.scorings[0].softcap == 2.0 and got.scorings[0].window is not None


def test_summaries_never_build_an_s_by_s_tensor():
    s, h, h_kv, d = 1024, 4, 2, 16
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(h, s, d, generator=gen), torch.randn(h_kv, s, d, generator=gen)
    scoring = LayerScoring(scale=d**-0.5, softcap=5.0)
    with LargestStorage() as largest:
        summary = summarize_layer(q, k, scoring, top_k=4, map_block=64, block_budget=h * 64 * s)
    assert summary.top_keys.shape == (h, s, 4)
    # The largest tensor is one block of scores, [h, 64, s] (or the [h, s, 4] results),
    # a sixteenth of one head's [s, s] map.
    assert largest.nbytes <= h * 64 * s * 8, (largest.nbytes, largest.op)
    assert largest.nbytes < s * s * 4


@pytest.mark.parametrize(("s", "map_block", "block_rows"), [(3, 2000, 3), (600, 600, 16)])
def test_a_large_map_block_costs_no_more_memory_than_the_map_needs(s, map_block, block_rows):
    # One cell: the map needs one block of scores at a time and a [h, 1, 1] result, never a
    # map_block × map_block tile, and the blocks of rows stay as small as the budget says.
    h, d = 2, 8
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(h, s, d, generator=gen), torch.randn(1, s, d, generator=gen)
    with LargestStorage() as largest:
        summary = summarize_layer(
            q, k, LayerScoring(scale=d**-0.5), top_k=2, map_block=map_block, block_budget=h * 16 * s
        )
    # The scorer's block: block_rows × (keys + 2 · block_rows of padding + a chunk), float32.
    assert largest.nbytes <= h * block_rows * (s + 2 * block_rows + TOP_CHUNK) * 4, (largest.nbytes, largest.op)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    dense = torch.softmax((q.double() @ k.double().transpose(1, 2) * d**-0.5).masked_fill(~causal, -math.inf), -1)
    assert summary.block_max is not None and summary.block_mean is not None
    torch.testing.assert_close(summary.block_max[:, 0, 0].double(), dense.amax(dim=(1, 2)), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(summary.block_mean[:, 0, 0].double(), dense.sum(dim=(1, 2)) / s**2, rtol=1e-5, atol=1e-6)


def test_a_pass_ends_after_the_last_layer_asked_or_at_the_next_layer_once_stopped(tiny_family_folder):
    model = models.load(tiny_family_folder("mistral"))
    ids = torch.randint(0, VOCAB - 1, (TEXT_LENGTH,), generator=torch.Generator().manual_seed(4))
    reached: list[int] = []
    every_layer = {
        model.hook_name("resid_pre", i): functools.partial(lambda i, _: reached.append(i), i)
        for i in range(model.num_layers)
    }
    with model.hooks(every_layer):
        long_context_summaries(model, ids, layers=[0])
    assert reached == [0]  # nothing after the layer asked runs
    reached.clear()
    with model.hooks(every_layer):
        long_context_summaries(model, ids, layers=[0], logits_at=[3])
    assert reached == list(range(model.num_layers))  # logits need every layer
    reached.clear()
    with model.hooks(every_layer), pytest.raises(models.RunStopped):
        long_context_summaries(model, ids, layers=[model.num_layers - 1], stop=lambda: len(reached) == 2)
    assert reached == [0, 1]
    asked = []
    q, k = torch.randn(2, 40, 8), torch.randn(2, 40, 8)
    with pytest.raises(models.RunStopped):
        summarize_layer(
            q, k, LayerScoring(scale=0.3), block_budget=2 * 40 * 4, stop=lambda: asked.append(1) or len(asked) == 3
        )
    assert len(asked) == 3  # asked before each block of 4 rows: stopped before the third


def test_distance_quantiles_of_a_mass():
    mass = torch.tensor([0.5, 0.0, 0.25, 0.25], dtype=torch.float64)
    assert distance_quantiles(mass, [0.25, 0.5, 0.6, 0.75, 1.0]) == [0, 0, 2, 2, 3]
    with pytest.raises(ValueError, match="quantiles"):
        distance_quantiles(mass, [1.5])


def test_arguments_out_of_range_are_named(tiny_family_folder):
    model = models.load(tiny_family_folder("mistral"))
    with pytest.raises(ValueError, match="layers must be"):
        long_context_summaries(model, "w1 w2 w3", layers=[5])
    with pytest.raises(ValueError, match="heads must be"):
        long_context_summaries(model, "w1 w2 w3", heads=[4])
    with pytest.raises(ValueError, match="logits_at"):
        long_context_summaries(model, "w1 w2 w3", logits_at=[3])
    with pytest.raises(ValueError, match="top_k"):
        long_context_summaries(model, "w1 w2 w3", top_k=0)


@pytest.mark.slow
def test_summaries_equal_dense_statistics_on_smollm2(smollm2):
    text = " ".join(f"Item {i} is {i * 7 % 13} and the sky is blue." for i in range(30))
    ids = smollm2.tokenize(text).ids[0, :300]
    layers = [0, 14, 29]
    dense = smollm2.run(ids, return_weights=layers, logits=False)
    got = long_context_summaries(smollm2, ids, layers=layers, top_k=5, window=32)
    for layer in layers:
        weights = dense.attentions[layer][0].double()  # [h, s, s], float32 weights
        expected = dense_statistics(weights, sink_tokens=1, window=32)
        summary = got.summaries[layer]
        for name, value in expected.items():
            # float32 scores on both sides, reduced in float64.
            torch.testing.assert_close(getattr(summary, name), value, rtol=1e-4, atol=2e-5, msg=f"{layer} {name}")
        torch.testing.assert_close(summary.top_weights.double(), weights.topk(5, dim=-1).values, rtol=1e-4, atol=1e-6)
        agree = (summary.top_keys[..., 0] == weights.argmax(-1)).double().mean()
        assert agree > 0.999, f"layer {layer}: the strongest key differs on {1 - float(agree):.4%} of the queries"


@pytest.mark.parametrize("window", [None, 3])
def test_bidirectional_summaries_use_the_absolute_distance(window):
    s, h, d = 12, 2, 8
    gen = torch.Generator().manual_seed(3)
    q, k = (
        torch.randn(h, s, d, generator=gen, dtype=torch.float64),
        torch.randn(h, s, d, generator=gen, dtype=torch.float64),
    )
    scores = q @ k.transpose(-1, -2) * d**-0.5  # [h, s, s]
    dist = (torch.arange(s)[:, None] - torch.arange(s)[None, :]).abs()
    if window is not None:
        scores = scores.masked_fill(dist >= window, float("-inf"))
    weights = scores.softmax(-1)
    summary = summarize_layer(
        q, k, LayerScoring(scale=d**-0.5, window=window, causal=False), window=2, top_k=3, block_budget=h * 5 * s
    )
    torch.testing.assert_close(summary.distance, (weights * dist).sum(-1))
    torch.testing.assert_close(summary.within_window, (weights * (dist < 2)).sum(-1))
    torch.testing.assert_close(summary.top_weights, weights.topk(3, dim=-1).values)


def test_layers_that_cannot_be_reproduced_are_refused():
    from attnkit.nn import AttentionConfig, MultiHeadAttention
    from attnkit.nn.positional import ALiBi

    alibi = MultiHeadAttention(AttentionConfig(16, 4), positional=ALiBi(4))
    with pytest.raises(ValueError, match="positional score bias \\(ALiBi\\)"):
        layer_scoring(alibi, causal=True, where="layer 3")
    local = MultiHeadAttention(AttentionConfig(16, 4, kernel="local", kernel_options={"window": 4}))
    with pytest.raises(ValueError, match="layer 3 runs the 'local' kernel"):
        layer_scoring(local, causal=True, where="layer 3")
    unscaled = layer_scoring(MultiHeadAttention(AttentionConfig(16, 4, score="dot")), causal=False)
    assert unscaled == LayerScoring(scale=1.0, causal=False)


def test_minilm_summaries_equal_its_dense_weights(minilm):
    text = "The animal didn't cross the road because it was too tired, and the road was long."
    name = minilm.hook_name("self_attn.pattern", 3)
    dense = minilm.run(text, return_weights=False, names_filter=[name]).cache[name][0].double()  # [h, s, s]
    got = long_context_summaries(minilm, text, layers=[3], top_k=2, window=4).summaries[3]
    s = dense.shape[-1]
    dist = (torch.arange(s)[:, None] - torch.arange(s)[None, :]).abs()
    torch.testing.assert_close(got.distance, (dense * dist).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.within_window, (dense * (dist < 4)).sum(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.top_weights.double(), dense.topk(2, dim=-1).values, rtol=1e-5, atol=1e-6)


def test_top_keys_of_long_rows_come_from_the_best_chunks():
    # Rows of more than 2 * top_k chunks of 64 keys take the two-stage top-k: each chunk's
    # maximum, then the keys of the best chunks. It must equal a plain top-k of dense weights.
    s, h, d = 1500, 2, 16
    gen = torch.Generator().manual_seed(4)
    q, k = (
        torch.randn(h, s, d, generator=gen, dtype=torch.float64),
        torch.randn(1, s, d, generator=gen, dtype=torch.float64),
    )
    scores = (q @ k[0].T) * d**-0.5  # [h, s, s]
    weights = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    summary = summarize_layer(q, k, LayerScoring(scale=d**-0.5), top_k=5, block_budget=h * 100 * s)
    top_w, top_i = weights.topk(5, dim=-1)  # [h, s, 5]
    present = top_w > 0
    assert torch.equal(summary.top_keys, torch.where(present, top_i, -1))
    torch.testing.assert_close(summary.top_weights, torch.where(present, top_w, 0.0), rtol=1e-10, atol=1e-12)


def test_only_the_statistics_asked_are_computed(tiny_family_folder):
    model = _double(models.load(tiny_family_folder("gemma3_text")))
    ids = torch.randint(0, VOCAB - 1, (TEXT_LENGTH,), generator=torch.Generator().manual_seed(5))
    full = long_context_summaries(model, ids, top_k=3, window=4)
    got = long_context_summaries(model, ids, top_k=3, window=4, local_statistics=("distance",))
    local = [i for i, scoring in got.scorings.items() if scoring.window is not None]
    assert local and len(local) < model.num_layers  # the tiny Gemma 3 has local and global layers
    for layer, summary in got.summaries.items():
        expected = full.summaries[layer]
        torch.testing.assert_close(summary.distance, expected.distance, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(summary.distance_mass, expected.distance_mass, rtol=1e-12, atol=1e-12)
        if layer in local:
            assert summary.sink is None and summary.entropy is None and summary.within_window is None
            assert summary.top_keys.shape[-1] == 0 and summary.top_weights.shape[-1] == 0
            assert set(summary.head_table()[0]) == {
                "layer",
                "head",
                "distance",
                *(f"distance_q{q}" for q in (25, 50, 75, 90)),
            }
        else:
            torch.testing.assert_close(summary.entropy, expected.entropy, rtol=1e-12, atol=1e-12)
            assert torch.equal(summary.top_keys, expected.top_keys)
    with pytest.raises(ValueError, match="statistics must be a collection of sink, distance"):
        long_context_summaries(model, ids, statistics="distance")
    with pytest.raises(ValueError, match="got \\('distances',\\)"):
        long_context_summaries(model, ids, local_statistics=("distances",))
