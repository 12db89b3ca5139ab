"""Activation patching by head, by layer and position, and by position, of every component
and metric, on every decoder family (tiny random checkpoints of
tests/fixtures/tiny_families.py) and on MiniLM: each cell equals a corrupted run with that
one activation replaced by a plain hook, and patching the residual stream into layer 0 at
the one position where the texts differ restores the whole difference."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.inspect import interventions
from tests.fixtures.tiny_families import CASES

pytest.importorskip("transformers")

CLEAN = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"
CORRUPT = "w3 w17 w5 w99 w40 w8 w61 w23 w70 w1"
DIFFERING = 4  # the position where the two texts differ
TARGET, WRONG = "w5", "w9"
# Patched cells run batched, the references one at a time: float32 sums in another order.
ATOL = 1e-4


@pytest.fixture(scope="module", params=sorted(CASES))
def family(request, tiny_family_folder):
    return models.load(tiny_family_folder(request.param))


@pytest.fixture(scope="module")
def llama(tiny_family_folder):
    return models.load(tiny_family_folder("llama_linear"))


def _logit_diff(model):
    target, wrong = model.to_single_token(TARGET), model.to_single_token(WRONG)
    return lambda logits: logits[:, target] - logits[:, wrong]


class Reference:
    """Restored fractions computed one cell at a time: a corrupted run with a hook on each
    patched layer replacing one index of the activation by the clean run's value."""

    def __init__(self, model, metric):
        self.model, self.metric = model, metric
        points = [f"self_attn.{c}" if c in interventions.PER_HEAD else c for c in interventions.COMPONENTS]
        names = [name for name in model.hook_names() if name.endswith(tuple("." + p for p in points))]
        self.clean = model.run(CLEAN, return_weights=False, names_filter=names)
        self.clean_value, self.corrupt_value = (
            self.value(model.run(text, return_weights=False)) for text in (CLEAN, CORRUPT)
        )

    def value(self, run):
        return float(self.metric(run.logits[:, -1].float())[0])

    def fraction(self, component, layers, where):
        """``where``: an index of the activation without its batch dimension."""
        point = f"self_attn.{component}" if component in interventions.PER_HEAD else component
        names = [self.model.hook_name(point, layer) for layer in layers]

        def patch(name):
            def hook(x):
                x = x.clone()
                x[(slice(None), *where)] = self.clean.cache[name][(0, *where)]
                return x

            return hook

        with self.model.hooks({name: patch(name) for name in names}):
            patched = self.value(self.model.run(CORRUPT, return_weights=False))
        return (patched - self.corrupt_value) / (self.clean_value - self.corrupt_value)


def test_resid_pre_of_layer_0_at_the_differing_position_restores_everything(family):
    effects = interventions.activation_patching(
        family, CLEAN, CORRUPT, by="layer-position", target=TARGET, wrong=WRONG, layers=[0]
    )
    assert effects.component == "resid_pre" and effects.effects.shape == (1, 10)
    assert abs(float(effects.effects[0, DIFFERING]) - 1.0) < ATOL
    # The other positions hold the same token in both texts: patching them changes nothing.
    others = torch.cat([effects.effects[0, :DIFFERING], effects.effects[0, DIFFERING + 1 :]])
    assert torch.equal(others, torch.zeros_like(others))


def test_every_component_by_layer_and_position_equals_a_plain_hook(family):
    reference = Reference(family, _logit_diff(family))
    layer = family.num_layers - 1
    for component in interventions.COMPONENTS:
        if component == "resid_mid" and not any(name.endswith("resid_mid") for name in family.hook_names()):
            continue  # attention and feed-forward run in parallel (GPT-NeoX): no stream between them
        effects = interventions.activation_patching(
            family, CLEAN, CORRUPT, by="layer-position", component=component, target=TARGET, wrong=WRONG
        )
        assert effects.effects.shape == (family.num_layers, 10)
        # z, q, k, v [h, s, d] and pattern [h, s, s_k]: every head at the (query) position;
        # the others [s, e].
        where = (slice(None), 9) if component in interventions.PER_HEAD else (9,)
        expected = reference.fraction(component, [layer], where)
        assert abs(float(effects.effects[layer, 9]) - expected) < ATOL, component
        # Before the first differing token a causal model's runs are equal.
        assert torch.equal(effects.effects[:, :DIFFERING], torch.zeros(family.num_layers, DIFFERING))


def test_by_head_and_by_position_equal_plain_hooks(family):
    reference = Reference(family, _logit_diff(family))
    heads = interventions.activation_patching(family, CLEAN, CORRUPT, target=TARGET, wrong=WRONG)
    assert heads.by == "head" and heads.component == "z"
    assert heads.effects.shape == (family.num_layers, family.num_heads)
    head = family.num_heads - 1
    assert abs(float(heads.effects[1, head]) - reference.fraction("z", [1], (head,))) < ATOL
    layers = list(range(family.num_layers))
    for component in ("mlp_out", "z"):
        together = interventions.activation_patching(
            family, CLEAN, CORRUPT, by="position", component=component, target=TARGET, wrong=WRONG
        )
        assert together.effects.shape == (1, 10) and together.row_labels == [f"0-{family.num_layers - 1}"]
        where = (slice(None), 7) if component == "z" else (7,)
        assert abs(float(together.effects[0, 7]) - reference.fraction(component, layers, where)) < ATOL, component


def test_the_metrics_log_p_and_a_function(llama):
    difference = interventions.activation_patching(
        llama, CLEAN, CORRUPT, by="layer-position", component="attn_out", target=TARGET, wrong=WRONG
    )

    def logit_difference(logits):
        return _logit_diff(llama)(logits)

    function = interventions.activation_patching(
        llama, CLEAN, CORRUPT, by="layer-position", component="attn_out", metric=logit_difference
    )
    assert torch.allclose(function.effects, difference.effects, atol=1e-6)
    assert function.metric == "fraction of the metric logit_difference restored"
    assert difference.metric == "fraction of the logit difference 'w5' - 'w9' restored"
    log_p = interventions.activation_patching(
        llama, CLEAN, CORRUPT, by="layer-position", component="attn_out", metric="log-p", target=TARGET
    )
    target = llama.to_single_token(TARGET)
    reference = Reference(llama, lambda logits: torch.log_softmax(logits, -1)[:, target])
    assert abs(float(log_p.effects[1, 9]) - reference.fraction("attn_out", [1], (9,))) < ATOL
    assert log_p.metric == "fraction of the log p('w5') restored" and log_p.wrong is None
    clean = log_p.baseline["clean"]
    assert abs(clean - float(torch.log_softmax(llama.run(CLEAN).logits[0, -1], -1)[target])) < 1e-5


def test_the_record_names_rows_and_columns(llama):
    effects = interventions.activation_patching(
        llama, CLEAN, CORRUPT, by="layer-position", component="resid_post", target=TARGET, wrong=WRONG, layers=[-1]
    )
    data = effects.to_dict()
    assert data["by"] == "layer-position" and data["component"] == "resid_post"
    assert data["columns"] == CLEAN.split() and data["layers"] == [1] and len(data["effects"][0]) == 10
    assert effects.row_labels == ["1"]
    assert interventions.layer_span([0, 1, 2]) == "0-2" and interventions.layer_span([3, 7]) == "3,7"


def test_encoders_patch_positions_and_measure_the_cosine(minilm):
    clean, corrupt = "The cat sat on the mat.", "The dog sat on the mat."
    effects = interventions.activation_patching(minilm, clean, corrupt, by="layer-position", layers=[0, 5])
    assert effects.columns[:3] == ["[CLS]", "The", "cat"]
    assert abs(float(effects.effects[0, 2]) - 1.0) < ATOL  # resid_pre of layer 0 at "cat"/"dog"
    assert effects.metric == "fraction of the cosine to the clean sentence embedding restored"
    heads = interventions.activation_patching(minilm, clean, corrupt, layers=[5])
    assert heads.effects.shape == (1, 12)


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"by": "head", "component": "resid_pre"},
            r"patching by head needs a per-head component \('z', 'q', 'k', 'v', 'pattern'\)",
        ),
        (
            {"by": "layer"},
            "by must be one of 'head', 'layer-position', 'position', 'dest-src', 'head-position', got 'layer'",
        ),
        ({"by": "dest-src", "component": "z"}, "by='dest-src' patches cells of the pattern; it takes no component 'z'"),
        (
            {"by": "head", "heads": [0]},
            r"heads choose the heads of by='dest-src'; by='head' takes none, got heads=\[0\]",
        ),
        ({"by": "dest-src", "heads": [9]}, r"has heads 0..\d+ \(or -\d+..-1\), got \[9\]"),
        ({"by": "dest-src", "heads": []}, "heads must name at least one head, got none"),
        ({"by": "position", "component": "scores"}, "component must be one of 'resid_pre', .*, got 'scores'"),
        ({"metric": "kl"}, "metric must be one of 'logit-diff', 'log-p', 'cosine' or a function, got 'kl'"),
        ({"metric": "log-p"}, "'log-p' measures the target alone and takes no wrong token"),
        ({"metric": "cosine"}, "'cosine' is the sentence-embedding metric of encoders"),
        ({"metric": lambda logits: logits[:, 0]}, "a metric function .* takes no target or wrong token"),
    ],
)
def test_options_that_do_not_fit_are_refused(llama, options, message):
    with pytest.raises(ValueError, match=message):
        interventions.activation_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, **options)


def test_missing_tokens_lengths_and_metric_functions_are_refused(llama, minilm):
    with pytest.raises(ValueError, match="give the target token .*use the metric 'log-p' with a target alone"):
        interventions.activation_patching(llama, CLEAN, CORRUPT, target=TARGET)
    with pytest.raises(ValueError, match="'log-p' measures the log-probability of a target token: give the target"):
        interventions.activation_patching(llama, CLEAN, CORRUPT, metric="log-p")
    with pytest.raises(ValueError, match=r"same number of tokens, got 10 \('w3' .*\) and 9 \('w3'"):
        interventions.activation_patching(
            llama, CLEAN, CORRUPT.rsplit(" ", 1)[0], by="position", target=TARGET, wrong=WRONG
        )
    with pytest.raises(ValueError, match=r"must return one number per row, a tensor \[1\], got \[\]"):
        interventions.activation_patching(llama, CLEAN, CORRUPT, metric=lambda logits: logits[0, 0])
    with pytest.raises(TypeError, match="metric must be one of .* or a function, got 3"):
        interventions.activation_patching(llama, CLEAN, CORRUPT, metric=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layers must name at least one layer, got none"):
        interventions.activation_patching(llama, CLEAN, CORRUPT, target=TARGET, wrong=WRONG, layers=[])
    with pytest.raises(ValueError, match="no difference to restore"):
        interventions.activation_patching(llama, CLEAN, CLEAN, target=TARGET, wrong=WRONG)
    with pytest.raises(ValueError, match="bidirectional encoder .* its metric is 'cosine'"):
        interventions.activation_patching(minilm, "The cat sat.", "The dog sat.", metric="log-p")


def test_a_component_the_layers_lack_is_refused(tiny_family_folder):
    parallel = models.load(tiny_family_folder("gpt_neox"))
    with pytest.raises(ValueError, match=r"the layers of gpt_neox have no 'resid_mid' \(layer 0 has resid_pre, "):
        interventions.activation_patching(
            parallel, CLEAN, CORRUPT, by="position", component="resid_mid", target=TARGET, wrong=WRONG
        )


def test_encoder_decoders_patch_heads_on_a_target_text_alone(tmp_path):
    from tests.fixtures.encoder_decoder_checkpoints import write_t5

    t5 = models.load(write_t5(tmp_path / "t5"))
    with pytest.raises(ValueError, match=r"t5 is an encoder-decoder: it patches each head's z \(by='head'\)"):
        interventions.activation_patching(t5, "a b", "a c", by="position", target="a")
    with pytest.raises(ValueError, match=r"give target=, no wrong token"):
        interventions.activation_patching(t5, "a b", "a c")


def test_encoder_decoders_refuse_heads_as_one_text_models_do(tiny_t5):
    """An encoder-decoder patches every head by head: ``heads`` (``by="dest-src"``'s) are
    refused, not ignored."""
    with pytest.raises(ValueError, match=r"t5 is an encoder-decoder: it patches every head in turn \(by='head'\) "):
        interventions.activation_patching(tiny_t5, "a b", "a c", target="a", heads=[0])
    with pytest.raises(ValueError, match=r"takes no heads \(they choose the heads of by='dest-src'\), got heads=\[\]"):
        interventions.activation_patching(tiny_t5, "a b", "a c", target="a", heads=[])


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_q_k_v_by_head_equal_transformers_projection_hooks(tiny_family_folder, component):
    """Patching one head's q, k or v (a key/value head with GQA) equals replacing that head's
    slice of transformers' projection output with the clean run's: the texts share their
    positions, so the rotary encoding of the clean values is the clean rotated values."""
    transformers = pytest.importorskip("transformers")
    folder = tiny_family_folder("qwen2")  # 4 query heads, 2 key/value heads, q/k/v biases
    model = models.load(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    effects = interventions.activation_patching(
        model, CLEAN, CORRUPT, by="head", component=component, target=TARGET, wrong=WRONG
    )
    heads = model.num_heads if component == "q" else model.num_kv_heads
    assert effects.component == component and effects.effects.shape == (model.num_layers, heads)
    metric = _logit_diff(model)
    clean_ids, corrupt_ids = model.tokenize(CLEAN).ids, model.tokenize(CORRUPT).ids
    layer, head = 1, heads - 1
    projection = getattr(hf.model.layers[layer].self_attn, f"{component}_proj")
    kept = {}
    handle = projection.register_forward_hook(lambda m, a, out: kept.setdefault("clean", out.clone()))
    with torch.no_grad():
        clean_value = float(metric(hf(clean_ids).logits[:, -1])[0])
        handle.remove()
        corrupt_value = float(metric(hf(corrupt_ids).logits[:, -1])[0])
        d = kept["clean"].shape[-1] // heads
        part = slice(head * d, (head + 1) * d)

        def patched(module, args, out):
            out = out.clone()
            out[..., part] = kept["clean"][..., part]
            return out

        handle = projection.register_forward_hook(patched)
        try:
            value = float(metric(hf(corrupt_ids).logits[:, -1])[0])
        finally:
            handle.remove()
    expected = (value - corrupt_value) / (clean_value - corrupt_value)
    assert abs(float(effects.effects[layer, head]) - expected) < 1e-4


def test_pattern_by_head_equals_a_plain_hook(llama):
    reference = Reference(llama, _logit_diff(llama))
    effects = interventions.activation_patching(
        llama, CLEAN, CORRUPT, by="head", component="pattern", target=TARGET, wrong=WRONG
    )
    assert effects.effects.shape == (llama.num_layers, llama.num_heads)
    for head in range(llama.num_heads):
        assert abs(float(effects.effects[1, head]) - reference.fraction("pattern", [1], (head,))) < ATOL


def test_pattern_by_destination_and_source_equals_a_plain_hook(llama):
    """Each cell replaces the pattern's weight of one destination on one source, in the heads
    and layers asked for, with the clean run's (TransformerLens' dest-src pattern patching)."""
    reference = Reference(llama, _logit_diff(llama))
    head, layer = llama.num_heads - 1, 1
    one = interventions.activation_patching(
        llama, CLEAN, CORRUPT, by="dest-src", target=TARGET, wrong=WRONG, layers=[layer], heads=[head]
    )
    assert one.component == "pattern" and one.heads == [head] and one.effects.shape == (10, 10)
    assert one.row_labels == one.columns and one.to_dict()["heads"] == [head]
    for dest, src in ((9, 4), (9, 9), (6, 0), (4, 4)):
        expected = reference.fraction("pattern", [layer], (head, dest, src))
        assert abs(float(one.effects[dest, src]) - expected) < ATOL, (dest, src)
    # A causal pattern is 0 above the diagonal in both runs, and equal before the first
    # differing token: nothing to patch there.
    assert torch.equal(one.effects.triu(1), torch.zeros(10, 10))
    assert torch.equal(one.effects[:DIFFERING], torch.zeros(DIFFERING, 10))
    every = interventions.activation_patching(llama, CLEAN, CORRUPT, by="dest-src", target=TARGET, wrong=WRONG)
    layers = list(range(llama.num_layers))
    assert every.heads == list(range(llama.num_heads)) and every.layers == layers
    expected = reference.fraction("pattern", layers, (slice(None), 9, 4))
    assert abs(float(every.effects[9, 4]) - expected) < ATOL
