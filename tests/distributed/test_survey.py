"""Per-head statistics with the texts split across gloo processes equal one process's; a text
that fails on one rank fails the survey on every rank; `attnkit heads --file --nproc 2` prints
and writes what one process does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.inspect.survey import survey_heads
from tests.distributed.processes import run_ranks
from tests.fixtures.known_attention import FakeModel

# Several processes each (torchrun-style ranks): seconds per test, left out of make test-fast.
pytestmark = pytest.mark.slow

# Fewer than 18 distinct words: the fake model gives every word its own id in any process.
TEXTS = ["a b c a b c", "d e f d", "a c e", "b d f b d f a", "c c c", "e f a b"]


def _check_survey(rank: int, world: int, texts: list[str], expected: dict) -> None:
    from attnkit.distributed import survey_heads as distributed_survey

    survey = distributed_survey(FakeModel(), texts, source="a", target="b", period=8)
    assert survey.texts == expected["texts"] and survey.tokens == expected["tokens"]
    assert survey.statistics.keys() == expected["statistics"].keys()
    for name, values in expected["statistics"].items():
        assert torch.equal(survey.statistics[name], values), name
    assert torch.equal(survey.pair.mass, expected["pair"].mass) and survey.pair.texts == expected["pair"].texts


def _check_failing_text(rank: int, world: int) -> None:
    from attnkit.distributed import survey_heads as distributed_survey

    try:
        distributed_survey(FakeModel(), ["a b", "c d", "e f", "  "], period=8)  # the last rank gets the empty one
    except ValueError as err:
        assert str(err) == "text 4 is empty", err
    else:
        raise AssertionError("an empty text was accepted")
    try:
        distributed_survey(FakeModel(), ["a b"], level="sentence", period=8)
    except ValueError as err:
        assert str(err) == "level must be one of token, word, got 'sentence'", err
    else:
        raise AssertionError("an unknown level was accepted")


def _check_survey_and_failing_text(rank: int, world: int, texts: list[str], expected: dict) -> None:
    _check_survey(rank, world, texts, expected)
    _check_failing_text(rank, world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_survey_split_across_ranks_equals_one_process_and_a_failing_text_fails_every_rank(world):
    single = survey_heads(FakeModel(), TEXTS, source="a", target="b", period=8)
    expected = {"texts": single.texts, "tokens": single.tokens, "statistics": single.statistics, "pair": single.pair}
    run_ranks(_check_survey_and_failing_text, world, TEXTS, expected, timeout=90)


SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.timeout(300)
def test_heads_file_nproc_equals_one_process(tmp_path, capsys, minilm_path):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("The cat sat on the mat.\nA dog barked at the mailman.\n\nRain fell all night long.\n")
    one, two = tmp_path / "one", tmp_path / "two"
    options = ["--file", str(corpus), "--model", "minilm", "--format", "json", "--quiet"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the processes: the same arithmetic, the same rounding
    try:
        assert main(["heads", *options, "--out", str(one)]) == 0
    finally:
        torch.set_num_threads(threads)
    single_out = capsys.readouterr().out
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "attnkit.cli", "heads", *options, "--nproc", "2", "--out", str(two)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.replace(str(two), str(one)) == single_out
    written = sorted(p.name for p in one.iterdir())
    assert written == sorted(p.name for p in two.iterdir()) and written
    for name in written:
        assert json.loads((two / name).read_text()) == json.loads((one / name).read_text())


def test_heads_nproc_needs_a_file(capsys):
    assert main(["heads", "one text", "--nproc", "2"]) == 2
    assert "give --file" in capsys.readouterr().err
