"""The needle-in-a-haystack probe and retrieval scores (attnkit.inspect.retrieval_heads)
against the same score counted on the model's own dense weights."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect.retrieval_heads import needle_probe, retrieval_scores


def _probe(model: models.Model, depth: float):
    return needle_probe(model, length=40, depth=depth, needle="w5 w6 w7 w8", question=" w9 w10", filler="w1 w2 w3")


@pytest.mark.parametrize("depth", [0.0, 0.4, 1.0])
def test_the_needle_sits_at_its_depth_and_is_asked_back(tiny_family_folder, depth):
    model = models.load(tiny_family_folder("gemma3_text"))
    probe = _probe(model, depth)
    assert probe.ids.numel() == 40
    n0, n1 = probe.needle
    a0, a1 = probe.answer
    assert (a0, a1) == (36, 40) and n1 - n0 == 4
    assert torch.equal(probe.ids[n0:n1], probe.ids[a0:a1])
    filler = 40 - 4 - 4 - 2
    assert n0 == round(depth * filler)
    assert probe.queries == [35, 36, 37, 38]


def test_retrieval_scores_equal_the_count_on_dense_weights(tiny_family_folder):
    model = models.load(tiny_family_folder("gemma3_text"))
    probe = _probe(model, 0.5)
    names = [model.hook_name("self_attn.pattern", i) for i in range(model.num_layers)]
    dense = model.run(probe.ids, return_weights=False, logits=True, names_filter=names)
    got = retrieval_scores(model, probe)
    targets = probe.ids[probe.answer[0] : probe.answer[1]]
    copied = dense.logits[0, probe.queries].argmax(-1) == targets
    assert got.copied == int(copied.sum()) and got.needle_tokens == 4
    for layer in range(model.num_layers):
        strongest = dense.cache[names[layer]][0][:, probe.queries].argmax(-1)  # [h, n]
        hit = (strongest >= probe.needle[0]) & (strongest < probe.needle[1])
        hit &= (probe.ids[strongest] == targets) & copied
        torch.testing.assert_close(got.scores[layer], hit.double().mean(-1))
    assert len(got.top(3)) == 3


def test_probe_arguments_are_checked(tiny_family_folder):
    model = models.load(tiny_family_folder("gemma3_text"))
    with pytest.raises(ValueError, match="depth must be in"):
        needle_probe(model, length=40, depth=1.5, needle="w5", filler="w1")
    with pytest.raises(ValueError, match="length must be more than"):
        needle_probe(model, length=3, needle="w5 w6", question=" w9", filler="w1")


@pytest.mark.slow
def test_smollm2_has_retrieval_heads_at_1k_tokens(smollm2):
    probe = needle_probe(smollm2, length=1024, depth=0.3)
    got = retrieval_scores(smollm2, probe, layers=[17, 18, 20])
    # SmolLM2 repeats the needle, and a few of its heads copy most of its tokens.
    assert got.copied >= got.needle_tokens - 2
    assert got.top(1)[0][2] >= 0.6
