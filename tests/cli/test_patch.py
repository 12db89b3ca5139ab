"""`attnkit patch --by head|layer-position|position --component C --metric M` on a tiny
random LLaMA: what it prints, the JSON and picture it writes, and the options it refuses
(before loading a model where it can)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit import models
from attnkit.cli import main, patch
from attnkit.inspect import interventions
from tests.fixtures.crafted import write_tiny_llama

CLEAN, CORRUPT = "the cat sat on the", "a cat sat on a"
TOKENS = ["the", "cat", "sat", "on", "the"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny")


def _patch(tiny, out, *options):
    argv = ["patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--model", str(tiny), "--out", str(out), "--quiet"]
    return main([*argv, *options])


def test_the_options_are_the_librarys():
    assert patch.BY == interventions.BY
    assert patch.COMPONENTS == interventions.COMPONENTS
    assert patch.METRICS == interventions.METRICS


def test_by_head_is_the_default(tiny, tmp_path, capsys):
    assert _patch(tiny, tmp_path, "--target", "mat", "--wrong", "b", "--format", "json") == 0
    printed = capsys.readouterr().out
    assert f"patching each head of {CLEAN!r} into {CORRUPT!r}" in printed
    assert "layers × heads (fraction of the logit difference 'mat' - 'b' restored):" in printed
    data = json.loads((tmp_path / "tiny_patching.json").read_text())
    assert data["by"] == "head" and data["component"] == "z" and data["columns"] == ["0", "1"]
    assert len(data["effects"]) == 2 and len(data["effects"][0]) == 2


def test_by_layer_and_position(tiny, tmp_path, capsys):
    options = ["--by", "layer-position", "--component", "resid_pre", "--target", "mat", "--wrong", "b"]
    assert _patch(tiny, tmp_path, *options) == 0
    printed = capsys.readouterr().out
    assert f"patching resid_pre at each layer and position of {CLEAN!r} into {CORRUPT!r}" in printed
    assert "layers × positions (fraction of the logit difference 'mat' - 'b' restored):" in printed
    assert "layer    the₁     cat     sat      on    the₂" in printed
    stem = "tiny_patching_resid_pre_by-layer-position"
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["columns"] == TOKENS and data["layers"] == [0, 1]
    # The texts differ at positions 0 and 4: the first holds the whole difference at layer 0
    # (the last position reads it through attention), the others none.
    assert data["effects"][0][1:4] == [0.0, 0.0, 0.0]
    assert (tmp_path / f"{stem}.png").stat().st_size > 0


@pytest.mark.parametrize("component", interventions.COMPONENTS)
def test_by_position_each_component(tiny, tmp_path, capsys, component):
    options = ["--by", "position", "--component", component, "--metric", "log-p", "--target", "mat"]
    assert _patch(tiny, tmp_path, *options, "--layers", "0,1", "--format", "json") == 0
    printed = capsys.readouterr().out
    assert f"patching {component} at each position (layers 0-1 together)" in printed
    assert "measure: fraction of the log p('mat') restored" in printed
    data = json.loads((tmp_path / f"tiny_patching_{component}_by-position.json").read_text())
    assert data["metric"] == "fraction of the log p('mat') restored" and data["wrong"] is None
    assert len(data["effects"]) == 1 and len(data["effects"][0]) == len(TOKENS)


def test_layers_pick_the_rows(tiny, tmp_path, capsys):
    options = ["--by", "layer-position", "--component", "mlp_out", "--target", "mat", "--wrong", "b"]
    assert _patch(tiny, tmp_path, *options, "--layers", "-1", "--format", "json") == 0
    data = json.loads((tmp_path / "tiny_patching_mlp_out_by-layer-position.json").read_text())
    assert data["layers"] == [1] and len(data["effects"]) == 1


def test_a_component_by_head_is_refused_before_loading(tiny, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(patch, "load_model_of", no_loading)
    argv = ["patch", "--clean", "a", "--corrupt", "b", "--by", "head", "--component", "attn_out"]
    assert main([*argv, "--model", str(tiny), "--quiet"]) == 2
    assert "--component attn_out is one vector per position" in capsys.readouterr().err


def test_errors_of_the_library_read_as_the_commands(tiny, tmp_path, capsys):
    assert _patch(tiny, tmp_path, "--metric", "log-p", "--target", "mat", "--wrong", "b") == 2
    assert "--metric log-p measures the --target token alone; leave out --wrong" in capsys.readouterr().err
    argv = ["patch", "--clean", CLEAN, "--corrupt", "a cat sat", "--model", str(tiny), "--by", "position"]
    assert main([*argv, "--target", "mat", "--wrong", "b", "--quiet"]) == 2
    assert "same number of tokens, got 5 ('the' 'cat' 'sat' 'on' 'the') and 3 ('a' 'cat' 'sat')" in (
        capsys.readouterr().err
    )
    assert _patch(tiny, tmp_path, "--by", "position", "--layers", "7", "--target", "mat", "--wrong", "b") == 2
    assert "layer" in capsys.readouterr().err


def test_encoders_measure_the_cosine(minilm_path, tmp_path, capsys):
    argv = ["patch", "--clean", "The cat sat.", "--corrupt", "The dog sat.", "--model", "minilm", "--by", "position"]
    options = ["--layers", "0", "--out", str(tmp_path), "--format", "json", "--quiet"]
    assert main([*argv, "--metric", "cosine", *options]) == 0
    assert "measure: fraction of the cosine to the clean sentence embedding restored" in capsys.readouterr().out
    data = json.loads((tmp_path / "minilm_patching_resid_pre_by-position.json").read_text())
    assert data["columns"] == ["[CLS]", "The", "cat", "sat", ".", "[SEP]"]
    assert abs(data["effects"][0][2] - 1.0) < 1e-4  # "cat" / "dog" at layer 0: the clean run back
    assert main([*argv, "--metric", "log-p", *options]) == 2
    assert "minilm is a bidirectional encoder without next-token logits; its metric is 'cosine'" in (
        capsys.readouterr().err
    )


def test_by_destination_and_source(tiny, tmp_path, capsys):
    options = ["--by", "dest-src", "--heads", "1", "--layers", "0", "--target", "mat", "--wrong", "b"]
    assert _patch(tiny, tmp_path, *options) == 0
    printed = capsys.readouterr().out
    assert f"each (destination, source) cell of the pattern (heads 1 of layers 0 together) of {CLEAN!r}" in printed
    assert "destinations × sources (fraction of the logit difference 'mat' - 'b' restored):" in printed
    assert "destination    the₁     cat     sat      on    the₂" in printed
    stem = "tiny_patching_pattern_by-dest-src"
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["heads"] == [1] and data["layers"] == [0] and data["columns"] == TOKENS
    expected = interventions.activation_patching(
        models.load(tiny),
        CLEAN,
        CORRUPT,
        by="dest-src",
        target="mat",
        wrong="b",
        layers=[0],
        heads=[1],
    )
    assert data["effects"] == [[round(v, 6) for v in row] for row in expected.effects.tolist()]
    assert (tmp_path / f"{stem}.png").stat().st_size > 0


def test_heads_go_with_dest_src_alone(tiny, tmp_path, capsys):
    assert _patch(tiny, tmp_path, "--heads", "0", "--target", "mat", "--wrong", "b") == 2
    assert "--heads chooses the heads of --by dest-src; --by head takes none" in capsys.readouterr().err


def test_every_block_kind_in_one_run(tiny, tmp_path, capsys):
    assert _patch(tiny, tmp_path, "--every", "--target", "mat", "--wrong", "b", "--format", "json") == 0
    printed = capsys.readouterr().out
    assert f"patching mlp_out at each layer and position of {CLEAN!r}" in printed
    assert f"patching each head's pattern of {CLEAN!r}" in printed
    written = sorted(path.name for path in tmp_path.glob("*.json"))
    assert len(written) == 13 and "tiny_patching_q_by-head.json" in written
    data = json.loads((tmp_path / "tiny_patching_v_by-layer-position.json").read_text())
    assert data["axes"] == ["layer", "position"] and data["columns"] == TOKENS


def test_attribution_patching_writes_its_estimate(tiny, tmp_path, capsys):
    assert _patch(tiny, tmp_path, "--attribution", "--target", "mat", "--wrong", "b", "--format", "json") == 0
    printed = capsys.readouterr().out
    assert f"attribution patching each head of {CLEAN!r} into {CORRUPT!r}" in printed
    assert "(linear approximation)" in printed
    data = json.loads((tmp_path / "tiny_attribution-patching.json").read_text())
    assert data["kind"] == "attribution patching" and data["axes"] == ["layer", "head"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--every", "--by", "position"], "--every patches every block kind"),
        (["--attribution", "--by", "dest-src"], "not --by dest-src"),
    ],
)
def test_every_and_attribution_refuse_what_does_not_fit(tmp_path, capsys, options, message):
    argv = ["patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--out", str(tmp_path), *options]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_by_head_and_position(tiny, tmp_path, capsys):
    options = ["--by", "head-position", "--component", "v", "--target", "mat", "--wrong", "b", "--format", "json"]
    assert _patch(tiny, tmp_path, *options) == 0
    printed = capsys.readouterr().out
    assert f"patching each head's v at each position of {CLEAN!r}" in printed
    assert "heads × positions (fraction of the logit difference 'mat' - 'b' restored):" in printed
    data = json.loads((tmp_path / "tiny_patching_v_by-head-position.json").read_text())
    assert data["axes"] == ["head", "position"] and data["columns"] == TOKENS
    assert data["rows"][0] == "L0H0" and len(data["effects"]) == len(data["rows"])
