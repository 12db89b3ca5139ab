"""Model.run_batch: several inputs in as few passes as possible, each equal to its own run;
and a run without the logits."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from tests.fixtures.crafted import write_tiny_llama


def _same(batch, alone, *, logits: bool) -> None:
    assert batch.tokens == alone.tokens and torch.equal(batch.ids, alone.ids) and batch.heads == alone.heads
    assert batch.attentions.keys() == alone.attentions.keys()
    for layer, weights in alone.attentions.items():
        torch.testing.assert_close(batch.attentions[layer], weights, atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.last_hidden_state, alone.last_hidden_state, atol=1e-4, rtol=1e-4)
    if logits:
        torch.testing.assert_close(batch.logits, alone.logits, atol=1e-4, rtol=1e-4)
    else:
        assert batch.logits is None


@pytest.mark.parametrize("logits", [True, False])
def test_a_causal_model_pads_texts_of_any_length_into_one_pass(tmp_path, logits):
    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    texts = ["the cat sat on the mat", "a", "on the mat the cat", [3, 4, 5]]
    passes = []
    model.module.token_embedding.register_forward_hook(lambda module, args, out: passes.append(args[0].shape))
    runs = model.run_batch(texts, return_weights=[0, -1], heads=[1], logits=logits)
    assert passes == [(4, 6)]  # one forward, padded to the longest
    for text, run in zip(texts, runs):
        _same(run, model.run(text, return_weights=[0, -1], heads=[1]), logits=logits)


def test_a_run_without_logits_skips_the_head_and_keeps_the_rest(tmp_path):
    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    calls = []
    model.module.lm_head.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    full = model.run("the cat sat", return_weights=[-1])
    assert len(calls) == 1
    bare = model.run("the cat sat", return_weights=[-1], logits=False)
    assert len(calls) == 1 and bare.logits is None and full.logits is not None
    assert torch.equal(bare.attentions[-1], full.attentions[-1])
    assert torch.equal(bare.last_hidden_state, full.last_hidden_state)


def test_a_bidirectional_model_runs_each_length_together(minilm):
    texts = ["The cat sat.", "A dog ran.", "Attention is all you need, they said."]
    runs = minilm.run_batch(texts, return_weights=[5])
    assert len(runs) == 3
    for text, run in zip(texts, runs):
        _same(run, minilm.run(text, return_weights=[5]), logits=False)


def test_bad_inputs_are_refused_before_any_pass(tmp_path):
    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    with pytest.raises(ValueError, match="text is empty"):
        model.run_batch(["the cat", ""])
    with pytest.raises(ValueError, match="layer 7 is out of range"):
        model.run_batch(["the cat"], return_weights=[7])
    assert model.run_batch([]) == []


def test_stop_ends_the_pass_at_the_next_layer(tmp_path):
    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    asked = []

    def stop() -> bool:
        asked.append(True)
        return len(asked) > 1  # let the first layer run, stop before the second

    with pytest.raises(models.RunStopped):
        model.run_batch(["the cat", "a"], stop=stop)
    assert len(asked) == 2
    assert model.run_batch(["the cat"], stop=lambda: False)[0].tokens == ["the", "cat"]  # hooks removed
    assert len(asked) == 2
