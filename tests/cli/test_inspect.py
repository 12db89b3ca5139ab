"""`attnkit inspect` on the real models: the notes' example, files, and clear errors."""

from __future__ import annotations

import json
import re

import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.names import EXAMPLE_TEXT
from attnkit.viz.terminal import display_width
from attnkit.viz.viewer import ViewerData

EXAMPLE_TOKENS = ["The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", "."]


def run(capsys, *argv):
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_is_the_notes_example(capsys, tmp_path, smollm2_path):
    code, out, err = run(capsys, "--out", str(tmp_path))
    assert code == 0, err
    assert "tokens: The | cat | sat | on | the | mat | .\n" in out
    assert "Layer 29, head 0" in out
    lines = out.splitlines()
    # One row per query token; the first can only attend to itself.
    header = next(i for i, line in enumerate(lines) if line.startswith("#  query"))
    assert lines[header + 2].split() == ["0", "The", "The", "1.00"]
    assert lines[header + 8].split()[:2] == ["6", "."]
    # The views fit 100 columns (the "wrote PATH (SIZE)" lines are as long as the path).
    assert max(display_width(line) for line in lines if not line.startswith("wrote ")) <= 100
    png, doc = tmp_path / "smollm2_layer29_head0.png", tmp_path / "smollm2_layer29_head0.json"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in out
    data = json.loads(doc.read_text())
    assert data["model"] == "smollm2" and data["layer"] == 29 and data["heads"] == [0]
    assert data["tokens"] == EXAMPLE_TOKENS and data["labels"] == ["The", "cat", "sat", "on", "the", "mat", "."]
    assert data["level"] == "token" and "words" not in data
    assert data["token_info"][1] == {
        "token": "Ġcat",
        "text": " cat",
        "span": [3, 7],
        "partial": False,
        "part": None,
        "special": False,
        "label": "cat",
    }
    weights = torch.tensor(data["weights"])  # [1, 7, 7]
    assert weights.shape == (1, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 7), atol=1e-5, rtol=0)
    assert weights[0].triu(1).abs().max() == 0  # causal: nothing on later tokens
    # The file holds the model's own weights.
    expected = models.load("smollm2").run("The cat sat on the mat.", return_weights=[29], heads=[0]).attentions[29][0]
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)


def test_minilm_all_heads_as_svg(capsys, tmp_path, minilm_path):
    code, out, err = run(
        capsys,
        "The animal was tired.",
        "--model",
        "minilm",
        "--layer",
        "-2",
        "--head",
        "all",
        "--format",
        "svg,json",
        "--top",
        "2",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    assert "minilm · layer 4 (0..5) · heads 0..11 · 7 tokens" in out
    assert out.count("the keys each query attends to most") == 12
    # Every head in one picture, as small multiples.
    assert [p.name for p in tmp_path.glob("*.svg")] == ["minilm_layer4_heads0-11.svg"]
    svg = (tmp_path / "minilm_layer4_heads0-11.svg").read_text()
    assert "Layer 4 — minilm" in svg and ">animal<" in svg and all(f">head {h}<" in svg for h in range(12))
    data = json.loads((tmp_path / "minilm_layer4_heads0-11.json").read_text())
    assert data["heads"] == list(range(12)) and data["tokens"][0] == "[CLS]" and data["tokens"][-1] == "[SEP]"
    weights = torch.tensor(data["weights"])  # [12, 7, 7]
    assert weights[:, 0].triu(1).sum() > 0  # bidirectional: the first token sees later ones


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layer", "30"], r"layer 30 is out of range: this model has 30 layers, 0\.\.29"),
        (["--layer", "-31"], r"0\.\.29 \(or -30\.\.-1 from the end\)"),
        (["--head", "9"], r"head 9 is out of range: this model has 9 heads per layer, 0\.\.8"),
        (["--head", "some"], 'head must be a number or "all"'),
        (["word " * 9000], r"text is \d+ tokens long; smollm2 reads at most 8192 tokens"),
    ],
)
def test_bad_layer_head_or_length_is_a_clear_error(capsys, tmp_path, smollm2_path, argv, message):
    code, out, err = run(capsys, *argv, "--out", str(tmp_path))
    assert code == 2 and out == ""
    # After the status lines (loading the model), the error is the last line.
    assert err.splitlines()[-1].startswith("attnkit: error: ") and re.search(message, err), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["  "], "the text is empty"),
        (["hi", "--format", "gif"], "--format takes a comma-separated list of png, svg, json, html, got 'gif'"),
        (["hi", "--top", "0"], "--top must be at least 1"),
        (
            ["hi", "--model", "gpt-17"],
            "--model 'gpt-17' is neither a known model (smollm2, minilm, gemma3), a folder, nor a Hugging Face name ORG/NAME",
        ),
        (["hi", "--model", "smolm2"], "did you mean 'smollm2'?"),
    ],
)
def test_bad_input_fails_before_running_a_model(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and out == ""


def test_a_missing_model_says_how_to_fetch_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path / "empty"))
    code, _, err = run(capsys, "hi", "--out", str(tmp_path))
    assert code == 2 and "attnkit models fetch smollm2" in err


KOREAN = "어제 밤에 배가 고파서 피자를 먹었다"
EOJEOL = ["어제", "밤에", "배가", "고파서", "피자를", "먹었다"]


def test_korean_word_level_end_to_end(capsys, tmp_path, smollm2_path):
    from attnkit.viz.fonts import choose_fonts, font_covers

    code, out, err = run(capsys, KOREAN, "--level", "word", "--format", "png,svg,json", "--out", str(tmp_path))
    assert code == 0, err
    assert "smollm2 · layer 29 (0..29) · head 0 · 6 words (44 tokens)" in out
    assert "words: 어제 (6) | 밤에 (6) | 배가 (6) | 고파서 (9) | 피자를 (9) | 먹었다 (8)" in out
    assert "tokens: 어(1/3) | 어(2/3) | 어(3/3) | 제(1/3)" in out
    rows = [line.split() for line in out.split("top 3 key words (weight)")[1].splitlines()[2:8]]
    assert [row[1] for row in rows] == EOJEOL
    assert max(display_width(line) for line in out.splitlines() if not line.startswith("wrote ")) <= 100
    stem = tmp_path / "smollm2_layer29_head0_words"
    png, svg, doc = (stem.with_suffix(s) for s in (".png", ".svg", ".json"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg_text = svg.read_text(encoding="utf-8")
    assert all(f">{word}<" in svg_text for word in EOJEOL)
    data = json.loads(doc.read_text(encoding="utf-8"))
    assert data["level"] == "word" and data["labels"] == EOJEOL
    assert [w["text"] for w in data["words"]] == EOJEOL and data["words"][3] == {
        "text": "고파서",
        "span": [9, 12],
        "tokens": list(range(18, 27)),
    }
    assert len(data["tokens"]) == len(data["token_info"]) == 44
    assert data["token_info"][6] == {
        "token": "Ġë",
        "text": " 밤",
        "span": [2, 4],
        "partial": True,
        "part": [1, 3],
        "special": False,
        "label": "밤(1/3)",
    }
    weights = torch.tensor(data["weights"])  # [1, 6, 6]
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 6), atol=1e-5, rtol=0)
    # No label anywhere is the replacement character of a cut UTF-8 sequence.
    assert not any("\ufffd" in text for text in (out, svg_text, doc.read_text(encoding="utf-8")))
    # The picture's fonts have a glyph for every label character: Hangul, not empty boxes.
    labels = "".join(EOJEOL)
    choice = choose_fonts([labels])
    assert not choice.missing, "install a font with Hangul, e.g. apt-get install fonts-noto-cjk"
    assert any(font_covers(family, labels) for family in choice.families)


def test_minilm_korean_tokens_read_as_the_text(capsys, tmp_path, minilm_path):
    code, out, err = run(
        capsys, KOREAN, "--model", "minilm", "--format", "svg,json", "--top", "1", "--out", str(tmp_path)
    )
    assert code == 0, err
    assert "tokens: [CLS] | 어(1/2) | 어(2/2) |" in out and "먹었다 | [SEP]\n" in out
    data = json.loads((tmp_path / "minilm_layer5_head0.json").read_text(encoding="utf-8"))
    assert data["level"] == "token" and data["tokens"][-2] == "[UNK]" and data["labels"][-2] == "먹었다"
    assert data["token_info"][-2]["span"] == [17, 20] and data["token_info"][0]["span"] is None
    svg = (tmp_path / "minilm_layer5_head0.svg").read_text(encoding="utf-8")
    assert ">먹었다<" in svg and ">어(1/2)<" in svg
    assert not any("\ufffd" in text for text in (out, svg, json.dumps(data, ensure_ascii=False)))


def embedded_viewer_data(page: str) -> ViewerData:
    """The data a viewer page embeds, decoded and checked by :meth:`ViewerData.from_json`."""
    match = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', page, re.S)
    assert match, "the page has no embedded attnkit-data"
    return ViewerData.from_json(match.group(1))


def test_html_is_the_viewer_of_every_layer_and_head(capsys, tmp_path, smollm2_path):
    code, out, err = run(capsys, "--format", "html", "--out", str(tmp_path))
    assert code == 0, err
    path = tmp_path / "smollm2_viewer.html"
    assert f"wrote {path}" in out and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    page = path.read_text(encoding="utf-8")
    # Self-contained: nothing to fetch from any host.
    assert not re.search(r"\b(?:https?|wss?|ftp):|//[a-z0-9.-]+\.[a-z]{2,}/", page, re.I)
    data = embedded_viewer_data(page)
    section = data.sections["self"]
    assert data.model_name == "smollm2" and data.kind == "causal" and data.text == EXAMPLE_TEXT
    # Every layer and head, not only the printed layer 29, head 0.
    assert section.layers == tuple(range(30)) and section.heads == tuple(range(9))
    assert section.query_tokens == section.key_tokens == ("The", "cat", "sat", "on", "the", "mat", ".")
    expected = models.load("smollm2").run(EXAMPLE_TEXT, return_weights=[3], heads=[5]).attentions[3][0, 0]
    torch.testing.assert_close(section.map(3, 5), expected.float(), atol=1e-5, rtol=0)


def test_html_between_words(capsys, tmp_path, smollm2_path):
    code, out, err = run(capsys, KOREAN, "--level", "word", "--format", "html,json", "--out", str(tmp_path))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "smollm2_layer29_head0_words.json",
        "smollm2_viewer_words.html",
    ]
    data = embedded_viewer_data((tmp_path / "smollm2_viewer_words.html").read_text(encoding="utf-8"))
    section = data.sections["self"]
    assert section.query_tokens == section.key_tokens == tuple(EOJEOL) and data.text == KOREAN
    assert section.layers == tuple(range(30)) and section.heads == tuple(range(9))
    torch.testing.assert_close(section.weights.sum(-1), torch.ones(30, 9, 6), atol=1e-4, rtol=0)
    # The page's word map of layer 29, head 0 is the one the JSON file holds.
    doc = json.loads((tmp_path / "smollm2_layer29_head0_words.json").read_text(encoding="utf-8"))
    torch.testing.assert_close(section.map(29, 0), torch.tensor(doc["weights"][0]), atol=1e-4, rtol=0)


def long_text(model, tokens: int) -> str:
    """A text of exactly ``tokens`` tokens for ``model``."""
    sentence = "Attention lets every word of a sentence look back at the words that came before it. "
    text = ""
    while len(model.tokenize(text + sentence).tokens) <= tokens:
        text += sentence
    while len(model.tokenize(text + " word").tokens) <= tokens:
        text += " word"
    assert len(model.tokenize(text).tokens) == tokens
    return text


@pytest.mark.slow
def test_2000_tokens_are_refused_with_the_estimates_before_running(capsys, tmp_path, smollm2):
    text = long_text(smollm2, 2000)
    code, out, err = run(capsys, text, "--format", "png,json,html", "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert "attnkit: loading smollm2 on cpu …" in err
    assert "the JSON of layer 29 would be about 30.3 MB" in err
    assert "the viewer page of 30 layers × 9 heads would be about 522.6 MB" in err
    assert "over the 20.0 MB limit per file, so nothing was written" in err and "--max-size" in err
    assert ("running" not in err and not tmp_path.exists()) or not list(tmp_path.iterdir())


def test_a_long_text_shows_progress_and_stays_within_the_limit(capsys, tmp_path, minilm):
    text = long_text(minilm, 500)
    code, out, err = run(capsys, text, "--model", "minilm", "--format", "png,json,html", "--out", str(tmp_path))
    # Every layer and head of 500 tokens is too large a page: refused, with the way out.
    assert code == 2 and "the viewer page of 6 layers × 12 heads would be about 30.2 MB" in err
    code, out, err = run(
        capsys,
        text,
        "--model",
        "minilm",
        "--format",
        "png,json,html",
        "--layers",
        "-1",
        "--heads",
        "0,3",
        "--dpi",
        "60",
        "--cmap",
        "magma",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    from attnkit.cli.common import format_size
    from attnkit.viz.estimates import estimate_viewer_html

    page = format_size(estimate_viewer_html(500, 1, 2, causal=False))
    progress = [line for line in err.splitlines() if line.startswith("attnkit: ") and "done in" not in line]
    assert progress == [
        "attnkit: loading minilm on cpu …",
        f"attnkit: the viewer page of 1 layer × 2 heads: about {page}, estimated before computing",
        "attnkit: running minilm on 500 tokens for layer 5 …",
        # Everything is computed (and checked finite) before the first file is written.
        "attnkit: computing the viewer page of 1 layer × 2 heads …",
        "attnkit: writing png, json of layer 5 …",
        "attnkit: writing the viewer page of 1 layer × 2 heads …",
    ]
    # The terminal table is shortened: 50 rows and a note per head, not 500.
    assert out.count("query rows left out (40..489); the JSON file (--format json) has every row") == 2
    assert len(out.splitlines()) < 150
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert sorted(files) == ["minilm_layer5_heads0_3.json", "minilm_layer5_heads0_3.png", "minilm_viewer.html"]
    assert all(size < 20_000_000 for size in files.values())
    # The estimates that guard the limit are close to what was written: the JSON's not below
    # it, the page's within 10% of it (a pessimistic page estimate refused pages that fit).
    from attnkit.viz.estimates import estimate_map_json, estimate_viewer_html

    assert 0.5 < files["minilm_layer5_heads0_3.json"] / estimate_map_json(500, 2, causal=False) <= 1.0
    assert files["minilm_viewer.html"] / estimate_viewer_html(500, 1, 2, causal=False) == pytest.approx(1, abs=0.1)
    data = embedded_viewer_data((tmp_path / "minilm_viewer.html").read_text(encoding="utf-8"))
    assert data.sections["self"].layers == (5,) and data.sections["self"].heads == (0, 3)


def test_quiet_prints_no_status(capsys, tmp_path, minilm_path):
    code, out, err = run(
        capsys, "The cat sat.", "--model", "minilm", "--format", "json", "--quiet", "--out", str(tmp_path)
    )
    assert code == 0 and err == "" and "wrote " in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layers", "1,x"], "--layers takes layers such as 29 or 0,5,-1 or \"all\", got '1,x'"),
        (["--layers", "6"], "layer 6 is out of range: this model has 6 layers"),
        (["--heads", "0,12"], "head 12 is out of range"),
        (["--max-size", "big"], "--max-size takes a size such as 20MB, 500kB, 2GB or \"none\", got 'big'"),
        (["--format", "png", "--cmap", "Bluez"], "unknown colour map 'Bluez'"),
        (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "nope"], "--device"),
    ],
)
def test_bad_selection_size_or_figure_options(capsys, tmp_path, minilm_path, argv, message):
    code, out, err = run(capsys, "The cat sat.", "--model", "minilm", *argv, "--out", str(tmp_path))
    assert code == 2 and message in err, err


def test_rows_show_the_chosen_query_tokens_against_every_key(capsys, tmp_path, smollm2_path):
    code, out, err = run(
        capsys, "--rows", "3:6", "--heads", "0,4", "--format", "json,png", "--out", str(tmp_path), "-q"
    )
    assert code == 0, err
    assert "query rows 3..5" in out
    header = next(i for i, line in enumerate(out.splitlines()) if line.startswith("#  query"))
    assert [line.split()[:2] for line in out.splitlines()[header + 2 : header + 5]] == [
        ["3", "on"],
        ["4", "the"],
        ["5", "mat"],
    ]
    stem = "smollm2_layer29_heads0_4_rows3-5"
    assert (tmp_path / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["rows"] == [3, 6] and data["heads"] == [0, 4] and len(data["labels"]) == 7
    weights = torch.tensor(data["weights"])  # [2, 3, 7]
    full = models.load("smollm2").run(EXAMPLE_TEXT, return_weights=[29], heads=[0, 4]).attentions[29][0]
    torch.testing.assert_close(weights, full[:, 3:6], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "2:x"], "--rows takes the query tokens as A:B"),
        (["--rows", "10:20"], "--rows 10:20: no rows selected by 10:20: the text has 7 tokens"),
        (["--rows=-2:", "--format", "html"], "--rows shows some rows of the raw weights between tokens"),
        (["--rows", "1:3", "--method", "rollout"], "not with --method rollout"),
        (["--rows", "1:3", "--level", "word"], "--level word"),
    ],
)
def test_rows_that_do_not_fit_are_refused_in_one_line(capsys, tmp_path, smollm2_path, argv, message):
    code, _, err = run(capsys, *argv, "--out", str(tmp_path), "-q")
    assert code == 2 and message in err and err.count("\n") == 1, err
