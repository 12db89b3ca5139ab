"""The documentation, help texts and docstrings speak to someone who has only this
repository: no references to notes, seeds, design files or issues that are not in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"the notes|seed 00[0-4]|note 00[0-4]|DESIGN\.md|the issue\b|issue's|\(issue \d+\)", re.I)


def test_no_references_to_material_outside_the_repository():
    files = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "docs").rglob("*.py"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "src").rglob("*.js"),
        *(ROOT / "src").rglob("*.html"),
    ]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_the_readme_tells_each_example_sentence_one_way():
    # "... cross the road ..." in one command and "... cross the street ..." in the next read
    # as two examples where there is one.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    animal = set(re.findall(r"The animal didn't cross the \w+ because it was too tired\.?", readme))
    assert len(animal) == 1, animal


def test_the_readme_counts_no_real_checkpoints():
    # "two real checkpoints" went stale as families were added: the opening names them
    # without a count.
    opening = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    assert re.search(r"\b(\d+|two|three|four|five) real checkpoints\b", opening) is None
    assert "real\ncheckpoints of every family" in opening


def test_the_decoder_start_token_of_each_family_is_the_one_documented(tmp_path):
    from attnkit import models
    from tests.fixtures.encoder_decoder_checkpoints import write_bart, write_t5

    page = " ".join((ROOT / "docs" / "encoder-decoder.md").read_text(encoding="utf-8").split())
    for family, write in (("BART", write_bart), ("T5", write_t5)):
        run = models.load(write(tmp_path / family)).run_encoder_decoder("the cat sat", "a dog")
        assert f"`{run.decoder_input_tokens[0]}` in {family}" in page
