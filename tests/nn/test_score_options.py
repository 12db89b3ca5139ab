"""The one place an attention layer's score, scale, soft-capping and window are applied:
the fused pass, the pattern a hook or cache sees and the chosen rows' weights agree."""

from __future__ import annotations

import math

import torch

from attnkit.functional.masks import Mask
from attnkit.nn import AttentionConfig, MultiHeadAttention, WeightSelection
from attnkit.nn.hooks import HookedModule
from attnkit.nn.score_options import ScoreOptions, softcapped_scores


class Causal(HookedModule):
    def __init__(self, attn: MultiHeadAttention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x):
        return self.attn(x, causal=True)


def test_the_default_scale_is_the_fused_passes_for_every_path():
    # 1/sqrt(6) and 6 ** -0.5 differ in the last bit: each path takes the first.
    assert 6**-0.5 != 1 / math.sqrt(6)
    assert ScoreOptions("scaled_dot", None, None, None).score_and_scale(6) == ("scaled_dot", 1 / math.sqrt(6))
    assert ScoreOptions("dot", None, None, None).scale_for(6) == 1.0
    assert ScoreOptions("dot", 0.5, None, None).scale_for(6) == 0.5
    score, scale = ScoreOptions("scaled_dot", None, 30.0, None).score_and_scale(6)
    assert scale == 1.0 and score.func is softcapped_scores
    assert score.keywords == {"scale": 1 / math.sqrt(6), "softcap": 30.0}


def test_the_window_joins_the_mask_once_there_are_more_keys_than_it_keeps():
    options = ScoreOptions("scaled_dot", None, None, 3)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    assert options.windowed(mask, 5, 3) is mask and options.windowed(None, 5, 3) is None
    assert isinstance(options.windowed(None, 5, 5), Mask)
    windowed = options.windowed(mask, 5, 5)
    assert windowed[0, 0, 4].tolist() == [False, False, True, True, True]


def test_fused_weights_pattern_and_chosen_rows_agree_with_softcap_and_window():
    torch.manual_seed(0)
    attn = MultiHeadAttention(AttentionConfig(12, 2, softcap=5.0, window=3)).double().eval()  # d = 6
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    full = attn(x, causal=True, return_weights=True).weights  # [2, 2, 7, 7]
    chosen = attn(x, causal=True, return_weights=WeightSelection(heads=[1], rows=range(2, 6))).weights
    patterns = []
    wrapped = Causal(attn)
    with wrapped.hooks({"attn.pattern": patterns.append}):
        wrapped(x)
    with torch.no_grad():
        _, cache = wrapped.run_with_cache(x)  # the pattern computed when first read
    torch.testing.assert_close(cache["attn.pattern"], full, rtol=0, atol=1e-12)
    torch.testing.assert_close(patterns[0], full, rtol=0, atol=1e-12)
    torch.testing.assert_close(chosen, full[:, 1:2, 2:6].float(), rtol=0, atol=1e-6)
    assert (full[:, :, 6, :4] == 0).all()  # the window keeps the last 3 keys
