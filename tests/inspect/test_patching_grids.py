"""Every block kind over every layer and position in one call, exactly and by attribution
patching, on a tiny random LLaMA (tests/fixtures/tiny_families.py): each exact grid equals
the loop written with plain hooks; attribution patching equals exact patching where the
linear approximation holds (a metric linear in what the patches change), ranks the cells as
it does, and equals finite differences everywhere."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect import interventions, metrics
from attnkit.inspect.patching_grids import EVERY, attribution_patching, every_block_patching

pytest.importorskip("transformers")

CLEAN = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"
CORRUPT = "w3 w17 w5 w99 w40 w8 w61 w23 w70 w1"
TARGET, WRONG = "w5", "w9"
ATOL = 1e-4


@pytest.fixture(scope="module")
def llama(tiny_family_folder):
    return models.load(tiny_family_folder("llama_linear"))


@pytest.fixture(scope="module")
def llama64(tiny_family_folder):
    # attnkit loads float32 at most; the modules compute in their weights' dtype.
    model = models.load(tiny_family_folder("llama_linear"))
    model.module.double()
    return model


def _point(component):
    return f"self_attn.{component}" if component in interventions.PER_HEAD else component


def _logit_diff(model, hooks=None, text=CORRUPT):
    t, w = model.to_single_token(TARGET), model.to_single_token(WRONG)
    with torch.no_grad():
        logits = model.run_with_hooks(model.tokenize(text).ids, hooks=hooks or {}).logits[0, -1].double()
    return float(logits[t] - logits[w])


def _index(component, by, column, head=None):
    """The index, without the batch dimension, that a cell patches."""
    if by == "head":
        return (column,)
    if by == "head-position":
        return (head, column)
    return (slice(None), column) if component in interventions.PER_HEAD else (column,)


def _replace(index, values):
    def hook(x):
        x = x.clone()
        x[(slice(None), *index)] = values[index].to(x)
        return x

    return hook


def test_every_grid_equals_the_plain_hooks_loop(llama):
    sweep = every_block_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG)
    assert sweep.keys() == list(EVERY) and sweep.kind == "patching"
    names = [llama.hook_name(_point(c), i) for c in interventions.COMPONENTS for i in range(llama.num_layers)]
    names = [name for name in names if name in llama.hook_names()]
    clean = llama.run(CLEAN, return_weights=False, names_filter=names).cache
    clean_value, corrupt_value = _logit_diff(llama, text=CLEAN), _logit_diff(llama)
    for component, by in EVERY:
        grid = sweep[component, by]
        assert grid.axes == (("layer", "head") if by == "head" else ("layer", "position"))
        for layer in range(llama.num_layers):
            name = llama.hook_name(_point(component), layer)
            for column in range(grid.effects.shape[1]):
                patched = _logit_diff(llama, {name: _replace(_index(component, by, column), clean[name][0])})
                expected = (patched - corrupt_value) / (clean_value - corrupt_value)
                assert float(grid.effects[layer, column]) == pytest.approx(expected, abs=ATOL), (component, by, layer)


def _linear_metric(model):
    """A metric linear in the residual stream between the last layer's blocks: the patches
    of that layer's z and attention output change it linearly."""
    name = model.hook_name("resid_mid", model.num_layers - 1)
    direction = torch.linspace(-1, 1, model.config.hidden_size, dtype=torch.float64)
    return metrics.of_cache(lambda run: (run.cache[name].double() @ direction).sum(-1), [name], "direction")


def test_attribution_equals_exact_patching_where_the_approximation_holds(llama64):
    metric = _linear_metric(llama64)
    last = [llama64.num_layers - 1]
    grids = [("z", "head"), ("z", "layer-position"), ("attn_out", "layer-position"), ("attn_out", "position")]
    exact = every_block_patching(llama64, CLEAN, CORRUPT, metric=metric, layers=last, grids=grids)
    approx = attribution_patching(llama64, CLEAN, CORRUPT, metric=metric, layers=last, grids=grids)
    assert approx.kind == "attribution patching"
    for key in grids:
        a, e = approx[key].effects.flatten(), exact[key].effects.flatten()
        assert torch.allclose(a, e, atol=1e-5), key
        # the cells that restore most, in the same order
        assert torch.equal(a.argsort(descending=True)[:3], e.argsort(descending=True)[:3]), key


def test_attribution_ranks_the_cells_of_a_nonlinear_metric_as_exact_patching_does(llama64):
    """Where the corruption is one token, the logit difference's first-order terms put the
    cells in about the same order as exact patching (rank correlation)."""
    grids = [("resid_pre", "layer-position"), ("z", "head")]
    exact = every_block_patching(llama64, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=grids)
    approx = attribution_patching(llama64, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=grids)
    for key in grids:
        a, e = approx[key].effects.flatten().double(), exact[key].effects.flatten().double()
        ranks = [t.argsort().argsort().double() for t in (a, e)]
        rho = torch.corrcoef(torch.stack(ranks))[0, 1]
        assert rho > 0.5, (key, float(rho))


def test_attribution_equals_finite_differences(llama64):
    """Each cell is the derivative of the metric along ``clean - corrupted`` of what it
    patches, over ``clean - corrupted`` of the metric: central differences in float64."""
    grids = [("resid_pre", "layer-position"), ("mlp_out", "layer-position"), ("q", "head"), ("v", "head")]
    grids += [("pattern", "head"), ("k", "layer-position"), ("z", "position"), ("v", "head-position")]
    approx = attribution_patching(llama64, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=grids)
    names = [llama64.hook_name(_point(c), i) for c, _ in grids for i in range(llama64.num_layers)]
    clean = llama64.run(CLEAN, return_weights=False, names_filter=names).cache
    corrupt = llama64.run(CORRUPT, return_weights=False, names_filter=names).cache
    gap = _logit_diff(llama64, text=CLEAN) - _logit_diff(llama64)
    eps = 1e-4
    for component, by in grids:
        grid = approx[component, by]
        layers = [list(range(llama64.num_layers))] if by == "position" else [[i] for i in range(llama64.num_layers)]
        heads = clean[llama64.hook_name(_point(component), 0)].shape[1] if by == "head-position" else 1
        cells = [(row, head) for row in range(len(layers)) for head in range(heads)]
        for (row, head), grid_row in zip(cells, range(grid.effects.shape[0]), strict=True):
            patched_layers = layers[row]
            for column in range(grid.effects.shape[1]):
                index = _index(component, by, column, head)

                def nudge(step, index=index, patched_layers=patched_layers, component=component):
                    hooks = {}
                    for layer in patched_layers:
                        name = llama64.hook_name(_point(component), layer)
                        delta = torch.zeros_like(clean[name][0])
                        delta[index] = (clean[name][0] - corrupt[name][0])[index]

                        def hook(x, delta=delta):
                            return x + step * delta.to(x)

                        hooks[name] = hook
                    return _logit_diff(llama64, hooks)

                derivative = (nudge(eps) - nudge(-eps)) / (2 * eps)
                cell = float(grid.effects[grid_row, column])
                assert cell == pytest.approx(derivative / gap, abs=1e-6), (component, by)


def test_the_record_labels_its_grids_and_refuses_what_it_lacks(llama):
    sweep = attribution_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=[("z", "head")])
    data = sweep.to_dict()
    assert data["kind"] == "attribution patching" and data["grids"][0]["axes"] == ["layer", "head"]
    with pytest.raises(KeyError, match=r"no grid \('z', 'position'\); this sweep has \('z', 'head'\)"):
        sweep["z", "position"]
    with pytest.raises(ValueError, match="not 'dest-src'"):
        attribution_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=[("pattern", "dest-src")])
    with pytest.raises(ValueError, match="at least one"):
        every_block_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=[])


def test_attribution_refuses_encoders(minilm):
    with pytest.raises(ValueError, match="causal decoder"):
        attribution_patching(minilm, "The cat sat.", "The dog sat.")


@pytest.mark.parametrize("component", ["z", "k", "pattern"])
def test_each_head_at_each_position_equals_the_plain_hooks_loop(llama, component):
    """TransformerLens' ``get_act_patch_attn_head_*_by_pos``: rows are the heads of every
    layer (``L1H2``), columns positions."""
    sweep = every_block_patching(
        llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, grids=[(component, "head-position")]
    )
    grid = sweep[component, "head-position"]
    names = [llama.hook_name(_point(component), i) for i in range(llama.num_layers)]
    clean = llama.run(CLEAN, return_weights=False, names_filter=names).cache
    heads = clean[names[0]].shape[1]
    assert grid.axes == ("head", "position") and grid.effects.shape == (llama.num_layers * heads, 10)
    assert grid.row_labels[: heads + 1] == [*(f"L0H{h}" for h in range(heads)), "L1H0"]
    clean_value, corrupt_value = _logit_diff(llama, text=CLEAN), _logit_diff(llama)
    for layer, name in enumerate(names):
        for head in range(heads):
            for column in range(10):
                patched = _logit_diff(llama, {name: _replace((head, column), clean[name][0])})
                expected = (patched - corrupt_value) / (clean_value - corrupt_value)
                cell = float(grid.effects[layer * heads + head, column])
                assert cell == pytest.approx(expected, abs=ATOL), (layer, head, column)
