"""Head ablation and activation patching on encoder-decoders (tiny random T5 and BART, tests/fixtures/encoder_decoder_checkpoints.py):
every encoder self-, decoder self- and cross-attention head zeroed (or taken from the clean
source's run) in turn equals zeroing (or replacing) that head's slice of the input of
transformers' output projection, measured on the target's log-probability from
transformers' own logits."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import models
from attnkit.inspect import interventions

# Slow (every head of tiny T5 and BART against transformers: about 3 s): outside make test-fast.
pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

SOURCE = "the big dog ran to the red house"
TARGET = "a cat sat on the mat"


@pytest.fixture(scope="module", params=["t5", "bart"])
def pair(request, tmp_path_factory):
    from tests.fixtures import encoder_decoder_checkpoints

    folder = getattr(encoder_decoder_checkpoints, f"write_{request.param}")(
        tmp_path_factory.mktemp(request.param) / "m"
    )
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    return models.load(folder), hf, request.param


def _output_projections(hf, family):
    """Row label -> the output projection of that attention module in transformers."""
    if family == "t5":
        enc, dec = hf.encoder.block, hf.decoder.block
        return {
            **{f"encoder {i} ": b.layer[0].SelfAttention.o for i, b in enumerate(enc)},
            **{f"decoder {i} self": b.layer[0].SelfAttention.o for i, b in enumerate(dec)},
            **{f"decoder {i} cross": b.layer[1].EncDecAttention.o for i, b in enumerate(dec)},
        }
    enc, dec = hf.model.encoder.layers, hf.model.decoder.layers
    return {
        **{f"encoder {i} ": layer.self_attn.out_proj for i, layer in enumerate(enc)},
        **{f"decoder {i} self": layer.self_attn.out_proj for i, layer in enumerate(dec)},
        **{f"decoder {i} cross": layer.encoder_attn.out_proj for i, layer in enumerate(dec)},
    }


def _log_p(hf, source_ids, decoder_input_ids, target_ids):
    with torch.no_grad():
        logits = hf(input_ids=source_ids, decoder_input_ids=decoder_input_ids).logits[0].double()
    return float(torch.log_softmax(logits, -1).gather(1, target_ids[0][:, None]).sum())


def test_every_head_of_the_three_kinds_equals_transformers_with_its_slice_zeroed(pair):
    model, hf, family = pair
    effects = interventions.head_ablation(model, SOURCE, target=TARGET)
    run = model.run_encoder_decoder(SOURCE, TARGET, encoder_layers=False, decoder_layers=False)
    ids = (run.source_ids, run.decoder_input_ids, run.target_ids)
    base = _log_p(hf, *ids)
    assert abs(effects.baseline - base) < 1e-4
    projections = _output_projections(hf, family)
    assert len(effects.row_labels) == len(projections)
    assert float(effects.effects.abs().min()) > 0  # every head of a random model matters
    assert effects.texts == {"text": SOURCE, "target": TARGET} and effects.to_dict()["rows"] == effects.row_labels
    head_dim = hf.config.d_kv if family == "t5" else hf.config.d_model // hf.config.encoder_attention_heads
    for row, label in enumerate(effects.row_labels):
        projection = projections[label if label.endswith(("self", "cross")) else label + " "]
        for head in range(effects.effects.shape[1]):

            def zero(module, args, head=head):
                x = args[0].clone()
                x[..., head * head_dim : (head + 1) * head_dim] = 0.0
                return (x,)

            handle = projection.register_forward_pre_hook(zero)
            try:
                expected = _log_p(hf, *ids) - base
            finally:
                handle.remove()
            assert math.isclose(float(effects.effects[row, head]), expected, abs_tol=1e-4), (label, head)


def test_encoder_decoders_need_a_target_text(pair):
    model, _, _ = pair
    with pytest.raises(ValueError, match="is an encoder-decoder: give the target text its decoder predicts"):
        interventions.head_ablation(model, SOURCE)


CORRUPT = "the big cat ran to the red house"


def test_patching_each_head_equals_transformers_with_its_slice_from_the_clean_run(pair):
    model, hf, family = pair
    effects = interventions.activation_patching(model, SOURCE, CORRUPT, target=TARGET)
    clean = model.run_encoder_decoder(SOURCE, TARGET, encoder_layers=False, decoder_layers=False)
    corrupt = model.run_encoder_decoder(CORRUPT, TARGET, encoder_layers=False, decoder_layers=False)
    clean_ids = (clean.source_ids, clean.decoder_input_ids, clean.target_ids)
    corrupt_ids = (corrupt.source_ids, corrupt.decoder_input_ids, corrupt.target_ids)
    projections = _output_projections(hf, family)
    kept = {}
    handles = [
        p.register_forward_pre_hook(lambda m, args, label=label: kept.__setitem__(label, args[0].clone()))
        for label, p in projections.items()
    ]
    try:
        clean_value = _log_p(hf, *clean_ids)
    finally:
        for handle in handles:
            handle.remove()
    corrupt_value = _log_p(hf, *corrupt_ids)
    assert abs(effects.baseline["clean"] - clean_value) < 1e-4
    assert abs(effects.baseline["corrupt"] - corrupt_value) < 1e-4
    head_dim = hf.config.d_kv if family == "t5" else hf.config.d_model // hf.config.encoder_attention_heads
    for row, label in enumerate(effects.row_labels):
        key = label if label.endswith(("self", "cross")) else label + " "
        for head in range(effects.effects.shape[1]):
            cut = slice(head * head_dim, (head + 1) * head_dim)

            def patch(module, args, key=key, cut=cut):
                x = args[0].clone()
                x[..., cut] = kept[key][..., cut]
                return (x,)

            handle = projections[key].register_forward_pre_hook(patch)
            try:
                expected = (_log_p(hf, *corrupt_ids) - corrupt_value) / (clean_value - corrupt_value)
            finally:
                handle.remove()
            assert math.isclose(float(effects.effects[row, head]), expected, abs_tol=1e-4), (label, head)
