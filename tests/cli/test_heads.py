"""`attnkit heads` on the real models: statistics, "it" → "animal", files, and errors."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.maps import readable_run
from attnkit.inspect.survey import DESCRIPTIONS
from attnkit.inspect.words import aggregate, word_groups
from attnkit.viz.terminal import display_width

ANIMAL = "The animal didn't cross the road because it was too tired."


def run(capsys, *argv):
    code = main(["heads", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def ranking(out: str) -> list[tuple[int, int, float]]:
    """The (layer, head, weight) rows of the --from/--to table."""
    lines = out.split("attends to")[1].split("Head roles")[0].splitlines()
    rows = [line.split() for line in lines if line.split()[:1] and line.split()[0].isdigit()]
    return [(int(layer), int(head), float(weight)) for _, layer, head, weight in rows]


def test_smollm2_it_attends_to_animal(capsys, tmp_path, smollm2_path):
    code, out, err = run(capsys, ANIMAL, "--from", "it", "--to", "animal", "--format", "json", "--out", str(tmp_path))
    assert code == 0, err
    assert "smollm2 · 30 layers × 9 heads · 1 text, 13 tokens" in out
    assert max(display_width(line) for line in out.splitlines()) <= 100
    top = ranking(out)
    assert len(top) == 10 and top == sorted(top, key=lambda row: -row[2])
    # A fixed checkpoint: the head that resolves "it" to "animal" most is layer 13, head 8.
    assert top[0][:2] == (13, 8) and top[0][2] > 0.5
    data = json.loads((tmp_path / "smollm2_heads.json").read_text())
    assert set(data["statistics"]) == set(DESCRIPTIONS)
    assert data["pair"]["from"] == "it" and round(data["pair"]["values"][13][8], 2) == top[0][2]
    # Induction heads exist in a trained causal LM, on random tokens it has never seen repeated.
    assert max(max(row) for row in data["statistics"]["induction"]["values"]) > 0.5


def test_minilm_from_a_file_with_pictures(capsys, tmp_path, minilm_path):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{ANIMAL}\n\nThe cat sat on the mat.\n", encoding="utf-8")
    out_dir = tmp_path / "out"
    code, out, err = run(
        capsys,
        "--file",
        str(texts),
        "--model",
        "minilm",
        "--from",
        "it",
        "--to",
        "animal",
        "--stat",
        "first",
        "--out",
        str(out_dir),
    )
    assert code == 0, err
    assert "minilm · 6 layers × 12 heads · 2 texts" in out
    assert "How much 'it' attends to 'animal' (1 text;" in out
    assert "first: mass on the first token (attention sink), layers × heads" in out
    names = {p.name for p in out_dir.iterdir()}
    assert names == {f"minilm_heads_{name}.png" for name in [*DESCRIPTIONS, "it-animal"]} | {"minilm_heads.json"}
    data = json.loads((out_dir / "minilm_heads.json").read_text())
    assert data["texts"] == 2 and len(data["pair"]["values"]) == 6 and len(data["pair"]["values"][0]) == 12


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give either a TEXT or --file FILE"),
        (["a b", "--file", "x.txt"], "give either a TEXT or --file FILE"),
        (["  "], "the text is empty"),
        (["a b", "--from", "it"], "--from and --to go together"),
        (["--file", "/nonexistent/texts.txt"], "cannot read --file /nonexistent/texts.txt"),
    ],
)
def test_bad_input_fails_before_running_a_model(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and out == ""


def test_a_token_not_in_the_text_lists_the_tokens(capsys, tmp_path, minilm_path):
    code, out, err = run(capsys, ANIMAL, "--model", "minilm", "--from", "it", "--to", "dog", "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert "no token 'dog' in the text; its tokens are 0:[CLS] 1:The 2:animal" in err
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_minilm_word_pair_in_korean(capsys, tmp_path, minilm_path):
    text = "어제 밤에 배가 고파서 피자를 먹었다"
    code, out, err = run(
        capsys,
        text,
        "--model",
        "minilm",
        "--from",
        "배가",
        "--to",
        "고파서",
        "--level",
        "word",
        "--format",
        "json",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    assert "How much '배가' attends to '고파서' (words, 1 text;" in out
    assert max(display_width(line) for line in out.splitlines()) <= 100
    pair = json.loads((tmp_path / "minilm_heads.json").read_text(encoding="utf-8"))["pair"]
    assert pair["level"] == "word" and pair["from"] == "배가"
    # [CLS] 어제 밤에 배가 고파서 ...: word 3 attending to word 4, from the model's own maps.
    model = models.load("minilm")
    model_run = model.run(text)
    words = word_groups(text, readable_run(model, model_run, text).tokens)
    assert [w.text for w in words[3:5]] == ["배가", "고파서"]
    expected = torch.stack([aggregate(model_run.attentions[layer][0], words)[:, 3, 4] for layer in range(6)])
    torch.testing.assert_close(torch.tensor(pair["values"]), expected, atol=1e-5, rtol=0)


def test_a_model_too_short_for_the_induction_probe_is_surveyed_without_it(capsys, tmp_path):
    from tests.fixtures.crafted import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "short")  # 32 positions, 9 ordinary tokens
    code, out, err = run(
        capsys, "the cat sat on the mat", "--model", str(folder), "--format", "json", "--out", str(tmp_path)
    )
    assert code == 0, err
    assert "note: no induction score: its probe is 50 distinct random tokens repeated twice, 100 tokens" in out
    assert "Head roles (I induction" in out and "induction on" not in out
    data = json.loads((tmp_path / "short_heads.json").read_text())
    assert "induction" not in data["statistics"] and data["notes"][0].startswith("no induction score")


def test_a_line_of_the_file_that_has_no_token_is_named_by_its_number(capsys, tmp_path, minilm_path):
    lines = tmp_path / "texts.txt"
    lines.write_text("the cat sat on the mat\n\n\u200b\nthe dog\n", encoding="utf-8")  # line 3: a zero-width space
    code, _, err = run(capsys, "--file", str(lines), "--model", "minilm", "--format", "json", "--out", str(tmp_path))
    assert code == 2 and f"--file {lines}, line 3: text is empty" in err
