"""ViewerData: construction from runs and nn records, validation, and the JSON form."""

from __future__ import annotations

import base64
import json
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnkit.nn import DecoderLM, DecoderLMConfig, Transformer, TransformerConfig
from attnkit.viz.viewer import (
    SCALE,
    Section,
    ViewerData,
    viewer_data_from_lm_output,
    viewer_data_from_run,
    viewer_data_from_transformer_output,
)


def softmax_maps(h: int, s_q: int, s_k: int, *, causal: bool = False, seed: int = 0) -> torch.Tensor:
    """``[h, s_q, s_k]`` rows that sum to one, masked above the diagonal when causal."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(h, s_q, s_k, generator=g) * 3
    if causal:
        scores = scores.masked_fill(~torch.ones(s_q, s_k, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1)


def test_from_run_stacks_layers_in_order():
    tokens = ["The", "cat", "sat"]
    attn = {2: softmax_maps(2, 3, 3, causal=True, seed=2), 0: softmax_maps(2, 3, 3, causal=True)[None]}
    data = ViewerData.from_run("toy", tokens, attn, causal=True, heads=[3, 5])
    section = data.sections["self"]
    assert data.kind == "causal" and list(data.sections) == ["self"]
    assert section.layers == (0, 2) and section.heads == (3, 5)
    assert section.query_tokens == section.key_tokens == ("The", "cat", "sat")
    assert section.weights.shape == (2, 2, 3, 3) and section.weights.dtype == torch.float32
    torch.testing.assert_close(section.map(2, 5), attn[2][1])


def test_json_round_trip_within_quantisation():
    attn = {layer: softmax_maps(3, 17, 17, seed=layer) for layer in range(4)}
    data = ViewerData.from_run("bert-ish", [f"w{i}" for i in range(17)], attn, causal=False, text="some text")
    text = data.to_json()
    back = ViewerData.from_json(text)
    assert back.model_name == "bert-ish" and back.kind == "bidirectional" and back.text == "some text"
    s, b = data.sections["self"], back.sections["self"]
    assert (b.query_tokens, b.layers, b.heads, b.causal) == (s.query_tokens, s.layers, s.heads, s.causal)
    error = (b.weights - s.weights).abs().max().item()
    assert error <= SCALE / 2 + 1e-7  # 7.6e-6: far inside the 1e-3 the viewer promises
    # JSON again from the decoded data is identical: quantisation is idempotent.
    assert back.to_json() == text


def test_json_schema_fields():
    data = ViewerData.from_run("toy", ["a", "b"], {0: softmax_maps(1, 2, 2, causal=True)}, causal=True)
    d = json.loads(data.to_json())
    assert d["format"] == "attnkit-viewer" and d["version"] == 1 and d["kind"] == "causal"
    w = d["sections"]["self"]["weights"]
    assert {k: w[k] for k in ("shape", "dtype", "byteorder", "compression", "encoding")} == {
        "shape": [1, 1, 2, 2],
        "dtype": "uint16",
        "byteorder": "little",
        "compression": "zlib",
        "encoding": "base64",
    }
    assert w["scale"] == pytest.approx(1 / 65535)
    # Decoding by hand, as docs/viewer.md describes it.
    raw = np.frombuffer(zlib.decompress(base64.b64decode(w["data"][0])), dtype="<u2").reshape(1, 2, 2)
    expected = data.sections["self"].weights[0].numpy()
    np.testing.assert_allclose(raw * w["scale"], expected, atol=1e-5)
    assert raw[0, 0, 1] == 0 and raw[0, 0, 0] == 65535  # the causal first row attends to itself only


def test_encoder_decoder_sections_and_display_order():
    src, tgt = ["a", "b", "c", "d"], ["<s>", "x", "y"]
    data = ViewerData.encoder_decoder(
        "toy-encoder-decoder",
        src,
        tgt,
        cross={0: softmax_maps(2, 3, 4)},
        encoder={0: softmax_maps(2, 4, 4)},
        decoder={0: softmax_maps(2, 3, 3, causal=True)},
    )
    assert list(data.sections) == ["encoder", "decoder", "cross"]
    cross = data.sections["cross"]
    assert cross.query_tokens == tuple(tgt) and cross.key_tokens == tuple(src) and not cross.causal
    assert data.sections["decoder"].causal
    back = ViewerData.from_json(data.to_json())
    assert back.sections["cross"].weights.shape == (1, 2, 3, 4)


def test_from_transformer_output_takes_every_kind_of_attention():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(16, 2, 32, num_encoder_layers=2, num_decoder_layers=3, dropout=0.0)).eval()
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    out = model(src, tgt, return_weights=True)
    data = viewer_data_from_transformer_output("toy-encoder-decoder", list("abcde"), list("wxyz"), out, index=1)
    assert data.kind == "encoder-decoder"
    assert data.sections["encoder"].layers == (0, 1) and data.sections["decoder"].layers == (0, 1, 2)
    torch.testing.assert_close(data.sections["cross"].map(2, 1), out.decoder_weights[2].cross_attention[1, 1])
    torch.testing.assert_close(data.sections["encoder"].map(1, 0), out.encoder_weights[1].self_attention[1, 0])


def test_from_lm_output_is_causal():
    torch.manual_seed(0)
    lm = DecoderLM(DecoderLMConfig(16, 2, 32, vocab_size=20, num_layers=2)).eval()
    out = lm(torch.randint(0, 20, (1, 6)), return_weights=True)
    data = viewer_data_from_lm_output("lm", list("abcdef"), out)
    assert data.kind == "causal"
    torch.testing.assert_close(data.sections["self"].map(1, 1), out.weights[1].self_attention[0, 1])


def test_from_model_run_uses_labels_heads_and_model_attributes():
    model = SimpleNamespace(name="fake", causal=False)
    run = SimpleNamespace(
        tokens=["[CLS]", "the", "Ġcat", "[SEP]"],
        offsets=[(0, 0), (0, 3), (3, 7), (0, 0)],
        attentions={1: softmax_maps(2, 4, 4)[None]},
        heads=[4, 7],
    )
    data = viewer_data_from_run(model, run, text="the cat")
    s = data.sections["self"]
    assert data.model_name == "fake" and data.kind == "bidirectional" and data.text == "the cat"
    assert s.query_tokens == ("[CLS]", "the", "cat", "[SEP]")
    assert s.heads == (4, 7) and s.layers == (1,)
    raw = viewer_data_from_run(model, run, name="other")
    assert raw.model_name == "other" and raw.sections["self"].key_tokens[2] == "Ġcat"
    with pytest.raises(ValueError, match="run the model with return_weights"):
        viewer_data_from_run(model, SimpleNamespace(tokens=["a"], offsets=[(0, 1)], attentions={}, heads=None))


def test_from_model_run_between_words_keeps_rows_summing_to_one():
    """Sub-word tokens ("s" + "at") become one word whose row is their rows' average and
    whose column is the sum of theirs; the JSON still decodes to rows that sum to 1."""
    text = "The cat sat."
    model = SimpleNamespace(name="fake", causal=True)
    run = SimpleNamespace(
        tokens=["The", "Ġcat", "Ġs", "at", "."],
        offsets=[(0, 3), (3, 7), (7, 9), (9, 11), (11, 12)],
        attentions={0: softmax_maps(3, 5, 5, causal=True)[None], 2: softmax_maps(3, 5, 5, causal=True, seed=1)[None]},
        heads=None,
    )
    data = ViewerData.from_json(viewer_data_from_run(model, run, text=text, level="word").to_json())
    s = data.sections["self"]
    assert s.query_tokens == s.key_tokens == ("The", "cat", "sat", ".")
    assert s.layers == (0, 2) and s.heads == (0, 1, 2) and data.text == text
    torch.testing.assert_close(s.weights.sum(-1), torch.ones(2, 3, 4), atol=4 * SCALE, rtol=0)
    token_map = run.attentions[2][0, 1]  # [s, s] of head 1
    sat_to_cat = token_map[2:4, 1].mean()
    sat_to_sat = token_map[2:4, 2:4].sum(-1).mean()
    assert s.map(2, 1)[2, 1].item() == pytest.approx(sat_to_cat.item(), abs=SCALE)
    assert s.map(2, 1)[2, 2].item() == pytest.approx(sat_to_sat.item(), abs=SCALE)
    with pytest.raises(ValueError, match="level must be one of token, word, got 'sentence'"):
        viewer_data_from_run(model, run, text=text, level="sentence")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(weights=torch.full((1, 1, 2, 2), 0.5).mul(3)), ValueError, r"post-softmax values in \[0, 1\]"),
        (dict(weights=torch.full((1, 1, 2, 2), float("nan"))), ValueError, "finite"),
        (dict(weights=torch.ones(1, 1, 2, 3)), ValueError, r"\[1, 1, 2, 2\].*got \[1, 1, 2, 3\]"),
        (dict(weights=torch.ones(1, 1, 2, 2, dtype=torch.long)), TypeError, "floating-point"),
        (dict(layers=(1, 1)), ValueError, "distinct non-negative"),
        (dict(query_tokens="ab"), TypeError, "sequence of str"),
    ],
)
def test_section_rejects_bad_input(change, error, match):
    fields = dict(
        query_tokens=("a", "b"), key_tokens=("a", "b"), layers=(0,), heads=(0,), weights=torch.full((1, 1, 2, 2), 0.5)
    )
    fields.update(change)
    with pytest.raises(error, match=match):
        Section(**fields)


def test_viewer_data_rejects_inconsistent_kind_and_sections():
    section = Section(("a",), ("a",), (0,), (0,), torch.ones(1, 1, 1, 1), causal=False)
    with pytest.raises(ValueError, match="kind must be one of"):
        ViewerData("m", "sideways", {"self": section})
    with pytest.raises(ValueError, match="must have causal=True"):
        ViewerData("m", "causal", {"self": section})
    with pytest.raises(ValueError, match=r"sections must be among \['encoder', 'decoder', 'cross'\]"):
        ViewerData("m", "encoder-decoder", {"self": section})
    with pytest.raises(ValueError, match="batch of one"):
        Section.from_layers(["a"], ["a"], {0: torch.ones(2, 1, 1, 1)})
    with pytest.raises(ValueError, match="same shape"):
        Section.from_layers(["a"], ["a"], {0: torch.ones(1, 1, 1), 1: torch.ones(2, 1, 1)})
    with pytest.raises(ValueError, match="format 'attnkit-viewer' version 1"):
        ViewerData.from_dict({"format": "other"})


def test_colour_mode_sections_share_the_self_sections_tokens():
    from dataclasses import replace

    tokens = ["a", "b", "c"]
    maps = {0: softmax_maps(2, 3, 3, causal=True, seed=0)}
    data = ViewerData.from_run("m", tokens, maps, causal=True)
    mode = Section.from_layers(tokens, tokens, {0: softmax_maps(1, 3, 3, causal=True, seed=1)}, heads=[0], causal=True)
    both = replace(data, sections={"rollout": mode, **data.sections})
    assert list(both.sections) == ["self", "rollout"]
    assert ViewerData.from_json(both.to_json()).sections["rollout"].heads == (0,)
    other = Section.from_layers(["x", "y", "z"], ["x", "y", "z"], {0: maps[0]}, causal=True)
    with pytest.raises(ValueError, match="the value section must have the self section's tokens"):
        replace(data, sections={**data.sections, "value": other})
    with pytest.raises(ValueError, match="a causal model needs its self section"):
        ViewerData("m", "causal", {"rollout": mode})
    with pytest.raises(ValueError, match=r"must be among \['self', 'value', 'rollout'\]"):
        replace(data, sections={**data.sections, "flow": mode})
