"""The Triton kernel of the long-context summaries (``summarize_layer(engine="triton")``) on CPU
tensors, through Triton's interpreter: against the statistics of dense float64 weights, and
against the torch engine on the same float32 inputs; then whole tiny models (local and global
layers, grouped-query heads, soft-capping, the layer's own scale) and the retrieval scores.

Run by ``tests/inspect/test_long_context_triton.py`` in a process of its own with
``TRITON_INTERPRET=1`` (Triton reads it when it is first imported); its name keeps the main
test run from collecting it. Float32 only: Triton's interpreter multiplies bfloat16 operands
of ``tl.dot`` as their raw 16-bit patterns, so bfloat16 is checked on a GPU
(``benchmarks/gpu_check.sh``). Sizes are small (the interpreter runs every block op in
NumPy) but cross every boundary: several tiles of 64 rows and 64 keys, a length that is no
multiple of 64, runs of rows that start mid-tile.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import Tensor

from attnkit import models
from attnkit.inspect.long_context import LayerScoring, LayerSummary, long_context_summaries, summarize_layer
from attnkit.inspect.retrieval_heads import needle_probe, retrieval_scores
from tests.fixtures.tiny_families import TEXT_LENGTH, VOCAB

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="runs in its own process under TRITON_INTERPRET=1"
)
PER_ROW = ("sink", "distance", "within_window", "entropy")


def dense_weights(q: Tensor, k: Tensor, scoring: LayerScoring) -> Tensor:
    """Float64 weights ``[h, s, s]`` of queries ``[h, s, d]`` and keys ``[h_kv, s, d]``."""
    q, k = q.double(), k.double().repeat_interleave(q.shape[0] // k.shape[0], 0)
    scores = q @ k.transpose(1, 2) * scoring.scale
    if scoring.softcap is not None:
        scores = torch.tanh(scores / scoring.softcap) * scoring.softcap
    s = q.shape[1]
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    allowed = j <= i if scoring.causal else torch.ones(s, s, dtype=torch.bool)
    if scoring.window is not None:
        allowed = allowed & ((i - j).abs() < scoring.window)
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


def dense_summary(weights: Tensor, rows: Tensor, *, top_k: int, sink_tokens: int, window: int, map_block: int):
    """Every statistic of dense weights ``[h, s, s]`` at ``rows``, computed the plain way."""
    s = weights.shape[-1]
    dist = (torch.arange(s)[:, None] - torch.arange(s)[None, :]).abs()
    w = weights[:, rows]  # [h, n_r, s]
    d = dist[rows]
    mass = torch.zeros(w.shape[0], s, dtype=torch.float64)
    counted = rows >= 1
    for r in range(rows.numel()):
        if counted[r]:
            mass.index_add_(1, d[r], w[:, r])
    top_w, top_i = w.topk(top_k, dim=-1)
    present = top_w > 0
    n = math.ceil(s / map_block)
    padded = torch.nn.functional.pad(weights, (0, n * map_block - s, 0, n * map_block - s))
    tiles = padded.reshape(-1, n, map_block, n, map_block)
    sizes = torch.full((n,), float(map_block), dtype=torch.float64)
    sizes[-1] = s - map_block * (n - 1)
    return {
        "sink": w[..., :sink_tokens].sum(-1),
        "distance": (w * d).sum(-1),
        "within_window": (w * (d < window)).sum(-1),
        "entropy": -torch.special.xlogy(w, w).sum(-1) / math.log(2),
        "distance_mass": mass / max(1, int(counted.sum())),
        "top_weights": torch.where(present, top_w, 0.0),
        "top_keys": torch.where(present, top_i, -1),
        "block_max": tiles.amax(dim=(2, 4)),
        "block_mean": tiles.sum(dim=(2, 4)) / (sizes[:, None] * sizes[None, :]),
    }


def assert_summaries_close(got: LayerSummary, want: LayerSummary, *, what: str) -> None:
    """Two summaries of the same float32 inputs agree: statistics within float32 rounding,
    the same top keys."""
    for name in (*PER_ROW, "distance_mass", "top_weights", "block_max", "block_mean"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), f"{what} {name}"
        if a is not None:
            torch.testing.assert_close(a.double(), b.double(), rtol=2e-5, atol=2e-6, msg=f"{what} {name}")
    assert torch.equal(got.top_keys, want.top_keys), what


def _random_qk(h: int, h_kv: int, s: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return 2 * torch.randn(h, s, d, generator=g), 2 * torch.randn(h_kv, s, d, generator=g)


CASES = {
    "causal, grouped heads": (LayerScoring(scale=0.25), None),
    "causal, window, soft-capped": (LayerScoring(scale=0.3, softcap=4.0, window=40), [3, 0, 2]),
    "bidirectional": (LayerScoring(scale=0.25, causal=False), [1]),
    "bidirectional window": (LayerScoring(scale=0.25, window=23, causal=False), [2, 3]),
}


@pytest.mark.parametrize("case", CASES)
def test_every_statistic_equals_dense_weights_and_the_torch_engine(case):
    scoring, heads = CASES[case]
    q, k = _random_qk(4, 2, 150, 16, seed=len(case))
    options = dict(heads=heads, top_k=3, sink_tokens=2, window=9, map_block=48)
    got = summarize_layer(q, k, scoring, engine="triton", **options)
    torch_engine = summarize_layer(q, k, scoring, engine="torch", **options)
    assert_summaries_close(got, torch_engine, what=case)
    chosen = list(range(4)) if heads is None else heads
    want = dense_summary(
        dense_weights(q, k, scoring)[chosen], torch.arange(150), top_k=3, sink_tokens=2, window=9, map_block=48
    )
    for name, value in want.items():
        if name == "top_keys":
            assert torch.equal(got.top_keys, value), case
        else:
            torch.testing.assert_close(getattr(got, name).double(), value, rtol=1e-5, atol=2e-6, msg=f"{case} {name}")


def test_chosen_rows_in_runs_that_start_mid_tile():
    scoring = LayerScoring(scale=0.25, window=50)
    q, k = _random_qk(2, 1, 140, 16, seed=7)
    rows = [0, 5, *range(60, 131), 139]
    got = summarize_layer(q, k, scoring, rows=rows, top_k=4, window=12, engine="triton")
    assert got.rows.tolist() == rows
    assert_summaries_close(
        got, summarize_layer(q, k, scoring, rows=rows, top_k=4, window=12, engine="torch"), what="rows"
    )
    want = dense_summary(
        dense_weights(q, k, scoring), torch.tensor(rows), top_k=4, sink_tokens=1, window=12, map_block=1
    )
    torch.testing.assert_close(got.distance_mass, want["distance_mass"], rtol=1e-5, atol=2e-6)
    assert torch.equal(got.top_keys, want["top_keys"])


def test_map_blocks_across_tiles_top_keys_alone_and_a_subset_of_statistics():
    scoring = LayerScoring(scale=0.25)
    q, k = _random_qk(1, 1, 70, 16, seed=8)
    # Blocks of 12 rows and keys: the block of 60 .. 71 spans two tiles of 64 each way.
    got = summarize_layer(q, k, scoring, map_block=12, top_k=2, engine="triton")
    want = dense_summary(
        dense_weights(q, k, scoring), torch.arange(70), top_k=2, sink_tokens=1, window=256, map_block=12
    )
    torch.testing.assert_close(got.block_max.double(), want["block_max"], rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(got.block_mean.double(), want["block_mean"], rtol=1e-5, atol=2e-6)
    # The top keys alone: the first pass only.
    top = summarize_layer(q, k, scoring, top_k=2, statistics=("top",), engine="triton")
    assert top.sink is None and top.distance is None and top.entropy is None and top.distance_mass is None
    assert torch.equal(top.top_keys, want["top_keys"])
    distance = summarize_layer(q, k, scoring, statistics=("distance", "window"), engine="triton")
    assert distance.top_keys.shape[-1] == 0 and distance.sink is None
    torch.testing.assert_close(distance.distance, want["distance"], rtol=1e-5, atol=2e-6)


def test_more_top_keys_than_a_query_has_and_a_top_k_beyond_a_power_of_two():
    scoring = LayerScoring(scale=0.25, window=4)
    q, k = _random_qk(1, 1, 30, 16, seed=9)
    got = summarize_layer(q, k, scoring, top_k=5, engine="triton")
    want = dense_summary(
        dense_weights(q, k, scoring), torch.arange(30), top_k=5, sink_tokens=1, window=256, map_block=1
    )
    assert torch.equal(got.top_keys, want["top_keys"])  # at most 4 keys per query: the fifth is -1
    assert (got.top_keys[:, :, 4] == -1).all() and (got.top_weights[:, :, 4] == 0).all()


def _float32(folder) -> models.Model:
    return models.load(folder, dtype=torch.float32)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_whole_models_equal_the_torch_engine(family, tiny_family_folder):
    # gemma2: soft-capping, windows on alternate layers, grouped-query heads, a query scale of
    # its own (query_pre_attn_scalar); gemma3_text: local and global layers, one key/value head.
    model = _float32(tiny_family_folder(family))
    ids = torch.randint(0, VOCAB - 1, (TEXT_LENGTH,), generator=torch.Generator().manual_seed(1))
    options = dict(top_k=4, sink_tokens=2, window=5, map_block=7 if family == "gemma2" else None)
    got = long_context_summaries(model, ids, engine="triton", **options)
    want = long_context_summaries(model, ids, engine="torch", **options)
    assert sorted(got.summaries) == list(range(model.num_layers))
    assert {scoring.window is None for scoring in got.scorings.values()} == {True, False}
    for layer, summary in got.summaries.items():
        assert_summaries_close(summary, want.summaries[layer], what=f"{family} layer {layer}")


def test_local_statistics_and_retrieval_scores_on_the_kernel(tiny_family_folder):
    model = _float32(tiny_family_folder("gemma3_text"))
    ids = torch.randint(0, VOCAB - 1, (TEXT_LENGTH,), generator=torch.Generator().manual_seed(2))
    got = long_context_summaries(model, ids, engine="triton", local_statistics=("distance",), top_k=2)
    want = long_context_summaries(model, ids, engine="torch", local_statistics=("distance",), top_k=2)
    for layer, summary in got.summaries.items():
        assert_summaries_close(summary, want.summaries[layer], what=f"layer {layer}")
    probe = needle_probe(model, length=40, depth=0.5, needle="w5 w6 w7 w8", question=" w9 w10", filler="w1 w2 w3")
    scores = retrieval_scores(model, probe, engine="triton")
    expected = retrieval_scores(model, probe, engine="torch")
    assert scores.copied == expected.copied and torch.equal(scores.scores, expected.scores)


def test_the_gpu_benchmarks_kernel_check_passes_here():
    from benchmarks import long_context_statistics

    rows = long_context_statistics.check_kernel(torch.device("cpu"), s=100, d=16, heads=2, dtypes=(torch.float32,))
    assert len(rows) == 4 and all(row["ok"] for row in rows), rows


def test_stop_is_asked_before_the_layers_launch():
    from attnkit.models import RunStopped

    q, k = _random_qk(1, 1, 20, 16, seed=10)
    with pytest.raises(RunStopped):
        summarize_layer(q, k, LayerScoring(scale=0.25), engine="triton", stop=lambda: True)
