"""A model's full cache leaves every attention layer's scores, pattern and per-head result
to be computed when first read (attnkit.nn.activation_cache): on each decoder family, one
text and a padded batch, what a read returns is what a pass with hooks on those points
forms, bit for bit, and the patterns are transformers' own (eager attention); weights,
options and cached tensors changed after the pass change no read."""

from __future__ import annotations

import pickle

import pytest
import torch
import transformers

from attnkit import models
from attnkit.nn import MultiHeadAttention

TEXT = "w1 w5 w2 w7 w3 w9 w4"
# More positions than any tiny family's head dim (at most 32): each per-head result, too, is
# left to be computed on read (a pass over fewer forms it, smaller than the copy of the
# output projection a read would need).
LONG_TEXT = " ".join([TEXT] * 6)
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
    ids = model.tokenize(LONG_TEXT).ids  # [1, s]
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
    ids, mask = model.to_tokens([LONG_TEXT, "w2 w3"])  # the second row padded
    _, cache = model.run_with_cache(ids, attention_mask=mask)
    assert len(cache.unread()) == 3 * model.num_layers
    formed = formed_during_the_pass(model, ids, mask)
    assert all(torch.equal(cache[name], formed[name]) for name in formed)


def test_a_pass_over_fewer_positions_than_the_head_dim_forms_the_per_head_results(tiny_family_folder) -> None:
    model = models.load(tiny_family_folder("qwen2"))
    ids = model.tokenize(TEXT).ids  # 7 positions, head dim 16
    _, cache = model.run_with_cache(ids)
    assert sorted(cache.unread()) == sorted(n for n in model.hook_names() if n.endswith(("scores", "pattern")))
    formed = formed_during_the_pass(model, ids)
    assert all(torch.equal(cache[name], formed[name]) for name in formed)


def _change_every_attention_layer(model) -> None:
    """What a careless user may do after a pass: an old-style optimizer step through
    ``.data``, a write through a NumPy view, other options."""
    layers = [m for m in model.module.modules() if isinstance(m, MultiHeadAttention)]
    assert layers
    for attention in layers:
        attention.out_proj.weight.data.mul_(0.5)
        view = attention.q_proj.weight.detach().numpy()
        view *= 2.0  # changes the next pass, not this one's cache
        attention.scale, attention.window = 0.05, 1
        if attention.softcap is not None:
            attention.softcap = 0.5


@pytest.mark.parametrize("read", ["read", "pickled"])
@pytest.mark.parametrize("case", ["gemma2", "qwen2"])
def test_a_model_changed_after_the_pass_changes_no_read(tiny_family_folder, case, read) -> None:
    model = models.load(tiny_family_folder(case))
    ids = model.tokenize(LONG_TEXT).ids
    formed = formed_during_the_pass(model, ids)
    _, cache = model.run_with_cache(ids)
    assert len(cache.unread()) == 3 * model.num_layers
    _change_every_attention_layer(model)
    heads = cache["z", 0].numpy()  # a cached tensor a deferred entry is computed from
    heads[:] = 0.0
    pattern = model.hook_name("pattern", 1)
    assert not torch.equal(formed_during_the_pass(model, ids)[pattern], formed[pattern])  # a pass now differs
    if read == "pickled":
        cache = pickle.loads(pickle.dumps(cache))
    deferred = [name for name in model.hook_names() if name.endswith(DEFERRED)]
    for name in deferred:
        assert torch.equal(cache[name], formed[name]), name
