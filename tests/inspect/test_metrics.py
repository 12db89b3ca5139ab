"""Metrics of every position (and of the cache) in ablation and patching, and ablation by
zero, mean and resampling, each against the same loop written with plain hooks on a tiny
random LLaMA (tests/fixtures/tiny_families.py)."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect import interventions, metrics

pytest.importorskip("transformers")

CLEAN = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"
CORRUPT = "w3 w17 w5 w99 w40 w8 w61 w23 w70 w1"
OTHERS = ["w4 w18 w6 w9 w41 w7 w60 w22 w71 w2", "w30 w1 w50 w19 w2 w28 w16 w3 w7 w11"]
TARGET, WRONG = "w5", "w9"
# Batched rows against single runs: float32 sums in another order.
ATOL = 1e-4


@pytest.fixture(scope="module")
def llama(tiny_family_folder):
    return models.load(tiny_family_folder("llama_linear"))


def _value(model, metric, text, hooks=None):
    """``metric`` of one run of ``text`` with plain hooks (none on the points it reads)."""
    ids = model.tokenize(text).ids
    kept = {}

    def keep(name):
        return lambda x: kept.__setitem__(name, x)

    with torch.no_grad(), model.hooks({**(hooks or {}), **{name: keep(name) for name in metric.reads}}):
        run = model.run_with_hooks(ids)
    return float(metric(metrics.MetricInput(run.logits.float(), ids, kept))[0])


def _z_replaced(model, layer, head, values):
    """A hook replacing head ``head`` of ``z`` by ``values`` ``[s or 1, d]``."""

    def hook(z):
        z = z.clone()
        z[:, head] = values.to(z)
        return z

    return {model.hook_name("self_attn.z", layer): hook}


def _loss_metric():
    return metrics.loss()


def _cache_metric(model):
    name = model.hook_name("resid_post", model.num_layers - 1)
    direction = torch.linspace(-1, 1, model.config.hidden_size)
    return metrics.of_cache(lambda run: (run.cache[name].float() @ direction).sum(-1), [name], "resid direction")


def test_ready_metrics_equal_their_formulas(llama):
    ids = llama.tokenize(CLEAN).ids
    logits = llama.run(CLEAN, return_weights=False).logits.float()
    run = metrics.MetricInput(logits, ids)
    t, w = llama.to_single_token(TARGET), llama.to_single_token(WRONG)
    diff = metrics.logit_difference(llama, TARGET, WRONG)(run)
    assert torch.allclose(diff, logits[:, -1, t] - logits[:, -1, w])
    at_3 = metrics.log_probability(llama, TARGET, position=3)(run)
    assert torch.allclose(at_3, logits[:, 3].log_softmax(-1)[:, t])
    assert torch.allclose(metrics.loss()(run), llama.loss_fn(logits, ids).reshape(1))
    mine = metrics.of_logits(lambda x: x[:, :, 0].sum(-1))
    assert torch.allclose(mine(run), logits[:, :, 0].sum(-1)) and mine.name == "metric"


def test_a_metric_that_does_not_return_a_number_per_row_is_refused(llama):
    logits = llama.run(CLEAN, return_weights=False).logits.float()
    wrong_shape = metrics.of_logits(lambda x: x.sum(), "total")
    with pytest.raises(ValueError, match=r"'total' must return one number per row, a tensor \[1\], got \[\]"):
        wrong_shape(metrics.MetricInput(logits, llama.tokenize(CLEAN).ids))


def test_a_ready_logit_difference_patches_as_the_named_metric(llama):
    named = interventions.activation_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG)
    ready = interventions.activation_patching(
        llama, CLEAN, CORRUPT, metric=metrics.logit_difference(llama, TARGET, WRONG)
    )
    assert torch.allclose(named.effects, ready.effects, atol=ATOL)
    assert ready.metric == f"fraction of the logit difference {TARGET!r} - {WRONG!r} restored"


@pytest.mark.parametrize("which", ["loss", "cache"])
@pytest.mark.parametrize("by", ["head", "layer-position"])
def test_patching_with_a_metric_of_every_position_or_of_the_cache_equals_plain_hooks(llama, which, by):
    metric = _loss_metric() if which == "loss" else _cache_metric(llama)
    effects = interventions.activation_patching(llama, CLEAN, CORRUPT, by=by, metric=metric)
    clean_value, corrupt_value = _value(llama, metric, CLEAN), _value(llama, metric, CORRUPT)
    names = [llama.hook_name("self_attn.z" if by == "head" else "resid_pre", i) for i in range(llama.num_layers)]
    clean = llama.run(CLEAN, return_weights=False, names_filter=names).cache
    for row, name in enumerate(names):
        for column in range(effects.effects.shape[1]):

            def patch(x, name=name, column=column):
                x = x.clone()
                x[:, column] = clean[name][0, column]
                return x

            patched = _value(llama, metric, CORRUPT, {name: patch})
            expected = (patched - corrupt_value) / (clean_value - corrupt_value)
            assert float(effects.effects[row, column]) == pytest.approx(expected, abs=ATOL), (row, column)


def test_ablation_with_a_ready_log_probability_equals_the_target(llama):
    named = interventions.head_ablation(llama, CLEAN, target=TARGET)
    ready = interventions.head_ablation(llama, CLEAN, metric=metrics.log_probability(llama, TARGET))
    assert torch.allclose(named.effects, ready.effects, atol=ATOL)
    assert ready.metric == f"change in log p({TARGET!r})" and ready.replacement == "zero"


@pytest.mark.parametrize("replacement", ["zero", "mean", "resample"])
def test_ablation_by_zero_mean_or_resampling_with_a_metric_equals_plain_hooks(llama, replacement):
    metric = metrics.loss()
    options = {"zero": {}, "mean": {"mean_over": OTHERS}, "resample": {"resample_from": OTHERS}}[replacement]
    effects = interventions.head_ablation(llama, CLEAN, metric=metric, **options)
    assert effects.replacement == replacement
    base = _value(llama, metric, CLEAN)
    names = [llama.hook_name("self_attn.z", i) for i in range(llama.num_layers)]
    others = [llama.run(text, return_weights=False, names_filter=names).cache for text in OTHERS]
    for layer, name in enumerate(names):
        for head in range(llama.num_heads):
            if replacement == "zero":
                sets = [torch.zeros(1, others[0][name].shape[-1])]
            elif replacement == "mean":
                every = torch.cat([cache[name][0, head] for cache in others])  # [positions, d]
                sets = [every.double().mean(0, keepdim=True).float()]
            else:
                sets = [cache[name][0, head] for cache in others]
            values = [_value(llama, metric, CLEAN, _z_replaced(llama, layer, head, z)) for z in sets]
            expected = sum(values) / len(values) - base
            assert float(effects.effects[layer, head]) == pytest.approx(expected, abs=ATOL), (layer, head)


def test_ablation_options_that_do_not_fit_are_refused(llama):
    with pytest.raises(ValueError, match="not both"):
        interventions.head_ablation(llama, CLEAN, target=TARGET, mean_over=OTHERS, resample_from=OTHERS)
    with pytest.raises(ValueError, match=r"as many tokens as the text \(10\), got 2"):
        interventions.head_ablation(llama, CLEAN, target=TARGET, resample_from=["w1 w2"])
    with pytest.raises(ValueError, match="takes no target token"):
        interventions.head_ablation(llama, CLEAN, target=TARGET, metric=metrics.loss())
