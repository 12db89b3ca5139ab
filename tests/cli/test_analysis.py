"""`attnkit inspect --method`, `attnkit heads --ablate` and `attnkit patch` (on MiniLM,
whose 6 layers keep these fast; SmolLM2 for what only a causal model has)."""

from __future__ import annotations

import json

import pytest

from attnkit.cli import main

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("method", ["raw", "rollout", "flow", "value", "grad"])
def test_inspect_methods_write_maps(capsys, tmp_path, minilm_path, method):
    extra = ["--target", "a kitten"] if method == "grad" else []
    argv = ["inspect", "cats sleep", "--model", "minilm", "--method", method, "--out", str(tmp_path), "--quiet"]
    assert main(argv + extra) == 0
    out = capsys.readouterr().out
    assert "minilm · layer 5 (0..5)" in out
    headless = method in ("rollout", "flow")
    tag = "all-heads" if headless else "head0"
    stem = f"minilm_layer5_{tag}" + ("" if method == "raw" else f"_{method}")
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["method"] == method and data["heads"] == ([] if headless else [0])
    assert len(data["weights"]) == 1 and len(data["weights"][0]) == 4  # [CLS] cats sleep [SEP]
    assert (tmp_path / f"{stem}.png").stat().st_size > 0


def test_inspect_method_errors(capsys, minilm_path):
    assert main(["inspect", "cats sleep", "--model", "minilm", "--method", "grad", "--quiet"]) == 2
    assert "--method grad needs --target" in capsys.readouterr().err
    long_text = " ".join(["word"] * 70)
    assert main(["inspect", long_text, "--model", "minilm", "--method", "flow", "--quiet", "--format", "json"]) == 2
    assert "takes at most 64 tokens, got 72; use rollout for longer texts" in capsys.readouterr().err


def test_heads_ablate_writes_the_grid(capsys, tmp_path, minilm_path):
    assert main(["heads", "cats sleep a lot", "--model", "minilm", "--ablate", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "minilm · zero ablation of each head on 'cats sleep a lot'" in out and "layers × heads" in out
    data = json.loads((tmp_path / "minilm_ablation.json").read_text())
    assert data["layers"] == list(range(6)) and len(data["effects"]) == 6 and len(data["effects"][0]) == 12
    assert all(v <= 1e-6 for row in data["effects"] for v in row)  # cos - 1 is never positive
    assert (tmp_path / "minilm_ablation.png").stat().st_size > 0
    reference = tmp_path / "reference.txt"
    reference.write_text("dogs bark\nbirds sing at dawn\n")
    argv = [
        "heads",
        "cats sleep",
        "--model",
        "minilm",
        "--ablate",
        "--mean",
        "--file",
        str(reference),
        "--out",
        str(tmp_path),
        "--format",
        "json",
        "--quiet",
    ]
    assert main(argv) == 0
    assert json.loads((tmp_path / "minilm_mean-ablation.json").read_text())["replacement"] == "mean"


def test_heads_ablate_errors(capsys, minilm_path, smollm2_path):
    assert main(["heads", "cats", "--model", "minilm", "--ablate", "--target", "x", "--quiet"]) == 2
    assert "takes no target token" in capsys.readouterr().err
    assert main(["heads", "The capital of France is", "--ablate", "--target", "Parisians", "--quiet"]) == 2
    assert "it tokenises as 'Paris' + 'ians' (2 tokens)" in capsys.readouterr().err
    assert main(["heads", "cats", "--model", "minilm", "--mean", "--quiet"]) == 2
    assert "--mean and --target go with --ablate" in capsys.readouterr().err


def test_patch_writes_the_grid_and_refuses_unequal_lengths(capsys, tmp_path, minilm_path, smollm2_path):
    argv = [
        "patch",
        "--clean",
        "The cat sat.",
        "--corrupt",
        "The dog sat.",
        "--model",
        "minilm",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert main(argv) == 0
    assert "patching each head of 'The cat sat.' into 'The dog sat.'" in capsys.readouterr().out
    data = json.loads((tmp_path / "minilm_patching.json").read_text())
    assert data["clean"] == "The cat sat." and len(data["effects"]) == 6
    argv = [
        "patch",
        "--clean",
        "The capital of France is",
        "--corrupt",
        "The capital city of Italy is",
        "--target",
        " Paris",
        "--wrong",
        " Rome",
        "--quiet",
    ]
    assert main(argv) == 2
    assert "same number of tokens, got 5 ('The' 'Ġcapital'" in capsys.readouterr().err
    assert main(["patch", "--clean", "a b", "--corrupt", "a c", "--target", " b", "--quiet"]) == 2
    assert "give the target token (the clean text's continuation) and the wrong token" in capsys.readouterr().err


@pytest.mark.parametrize(("method", "heads"), [("value", tuple(range(12))), ("rollout", (0,))])
def test_inspect_html_adds_the_method_as_a_colour_mode(capsys, tmp_path, minilm_path, method, heads):
    from attnkit.viz.viewer import ViewerData
    from tests.viz.test_viewer_html import page_parts

    argv = [
        "inspect",
        "cats sleep",
        "--model",
        "minilm",
        "--method",
        method,
        "--format",
        "html",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert main(argv) == 0
    data = ViewerData.from_json(page_parts((tmp_path / "minilm_viewer.html").read_text())["data"])
    assert list(data.sections) == ["self", method]
    mode = data.sections[method]
    assert mode.layers == tuple(range(6)) and mode.heads == heads
    assert mode.weights.amax() <= 1.0 and mode.query_tokens == data.sections["self"].query_tokens


def test_heads_ablate_by_resampling(capsys, tmp_path, minilm_path):
    reference = tmp_path / "reference.txt"
    reference.write_text("dogs bark\nbirds sing\n")
    argv = ["heads", "cats sleep", "--model", "minilm", "--ablate", "--resample", "--file", str(reference)]
    assert main([*argv, "--out", str(tmp_path), "--format", "json", "--quiet"]) == 0
    assert "minilm · resample ablation of each head on 'cats sleep'" in capsys.readouterr().out
    assert json.loads((tmp_path / "minilm_resample-ablation.json").read_text())["replacement"] == "resample"
    assert main(["heads", "cats sleep", "--model", "minilm", "--ablate", "--resample", "--quiet"]) == 2
    assert "--resample takes the texts of --file" in capsys.readouterr().err
