"""A model's full cache leaves every attention layer's scores, pattern and per-head result
to be computed when first read (attnkit.nn.activation_cache): on each decoder family, one
text and a padded batch, what a read returns is what a pass with hooks on those points
forms, bit for bit, and the patterns are transformers' own (eager attention)."""

from __future__ import annotations

import pytest
import torch
import transformers

from attnkit import models

TEXT = "w1 w5 w2 w7 w3 w9 w4"
DEFERRED = ("scores", "pattern", "result")


def formed_during_the_pass(model, ids, attention_mask=None) -> dict[str, torch.Tensor]:
    """The cache of a pass with a reading hook on every deferrable point, which forms them."""
    hooks = {name: (lambda t: None) for name in model.hook_names() if name.endswith(DEFERRED)}
    with torch.no_grad():
        run = model.run_with_hooks(ids, hooks=hooks, names_filter=None, attention_mask=attention_mask)
    return dict(run.cache)


@pytest.mark.parametrize("case", ["gpt2", "qwen2", "mistral", "gemma2", "gemma3_text", "phi3"])
def test_every_family_reads_back_what_a_hooked_pass_forms(tiny_family_folder, case) -> None:
    folder = tiny_family_folder(case)
    model = models.load(folder)
    ids = model.tokenize(TEXT).ids  # [1, s]
    logits, cache = model.run_with_cache(ids)
    deferred = [name for name in model.hook_names() if name.endswith(DEFERRED)]
    assert sorted(cache.unread()) == sorted(deferred) and len(deferred) == 3 * model.num_layers
    formed = formed_during_the_pass(model, ids)
    assert list(cache) == list(formed)
    for name in formed:
        assert torch.equal(cache[name], formed[name]), name
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = hf(ids, output_attentions=True).attentions  # L x [1, h, s, s]
    for layer, weights in enumerate(attentions):
        assert torch.allclose(cache["pattern", layer], weights, atol=1e-5), layer
    with torch.no_grad():
        plain = model.run_with_hooks(ids).logits  # no hook, no cache
    assert torch.equal(logits, plain)


def test_a_padded_batch_reads_back_what_a_hooked_pass_forms(tiny_family_folder) -> None:
    model = models.load(tiny_family_folder("qwen2"))
    ids, mask = model.to_tokens([TEXT, "w2 w3"])  # the second row padded
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    assert len(cache.unread()) == 3 * model.num_layers
    formed = formed_during_the_pass(model, ids, mask)
    assert all(torch.equal(cache[name], formed[name]) for name in formed)
