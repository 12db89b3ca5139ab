"""Head detectors (attnkit.inspect.detectors) against scores computed with loops from
transformers' own attention weights of the same tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect.detectors import DETECTORS, detect_heads, detection_pattern

transformers = pytest.importorskip("transformers")

# w5 w99 repeats: duplicates and an induction target (w99 after the second w5).
TEXT = "w3 w17 w5 w99 w42 w8 w61 w5 w99 w70 w3 w17"


def _expected_pattern(kind: str, ids: list[int]) -> torch.Tensor:
    s = len(ids)
    pattern = torch.zeros(s, s)
    for i in range(s):
        for j in range(i + 1):
            if kind == "previous-token":
                pattern[i, j] = float(j == i - 1)
            elif kind == "duplicate-token":
                pattern[i, j] = float(j < i and ids[j] == ids[i])
            else:
                pattern[i, j] = float(j >= 1 and j - 1 < i and ids[j - 1] == ids[i])
    return pattern


@pytest.mark.parametrize("case", ["qwen2", "gpt2"])
def test_scores_equal_loops_over_transformers_attention(tiny_family_folder, case):
    folder = tiny_family_folder(case)
    model = models.load(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = model.tokenize(TEXT).ids
    with torch.no_grad():
        attentions = hf(ids, output_attentions=True).attentions  # L x [1, h, s, s]
    for kind in DETECTORS:
        pattern = _expected_pattern(kind, ids[0].tolist())
        assert torch.equal(detection_pattern(kind, ids[0]), pattern), kind
        for exclude_bos, exclude_current in ((False, False), (True, True)):
            result = detect_heads(model, TEXT, kind, exclude_bos=exclude_bos, exclude_current=exclude_current)
            assert result.scores.shape == (model.num_layers, model.num_heads)
            for layer, weights in enumerate(attentions):
                for head in range(model.num_heads):
                    w = weights[0, head].clone()
                    if exclude_bos:
                        w[:, 0] = 0
                    if exclude_current:
                        w.fill_diagonal_(0)
                    expected = float((w * pattern).sum() / w.sum())
                    assert abs(float(result.scores[layer, head]) - expected) < 1e-5, (kind, layer, head)


def test_a_users_pattern_layers_and_the_record(tiny_family_folder):
    model = models.load(tiny_family_folder("llama_linear"))
    s = len(model.tokenize(TEXT))
    first = torch.zeros(s, s)
    first[:, 0] = 1
    result = detect_heads(model, TEXT, first, layers=[-1])
    assert result.detector == "custom" and result.layers == [model.num_layers - 1]
    run = model.run(TEXT, return_weights=[-1])
    assert torch.allclose(result.scores[0], run.attentions[-1][0, :, :, 0].sum(-1) / s, atol=1e-5)
    layer, head, score = result.top(1)[0]
    assert layer == model.num_layers - 1 and score == pytest.approx(float(result.scores.max()))
    record = result.to_dict()
    assert record["kind"] == "detection" and len(record["scores"]) == 1 and record["columns"][0] == "0"
    with pytest.raises(ValueError, match=r"must be \[s, s\]"):
        detect_heads(model, TEXT, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="detector must be one of"):
        detect_heads(model, TEXT, "copying")
