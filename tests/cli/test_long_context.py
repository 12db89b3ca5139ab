"""`attnkit inspect --long` and `attnkit heads --stat sink|distance|retrieval` on tiny random
checkpoints: what they print and write, equal to the Python functions, and their errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.long_context import long_context_summaries
from attnkit.inspect.retrieval_heads import needle_probe, retrieval_scores

TEXT = " ".join(f"w{(i * 7) % 40 + 1}" for i in range(50))


@pytest.mark.slow
def test_inspect_long_writes_the_head_table_top_keys_and_maps(capsys, tmp_path, tiny_family_folder):
    folder = tiny_family_folder("gemma3_text")
    (tmp_path / "text.txt").write_text(TEXT)
    argv = ["inspect", "--long", "--file", str(tmp_path / "text.txt"), "--model", str(folder), "--top", "2"]
    code = main([*argv, "--window", "4", "--layers", "0,1", "--out", str(tmp_path / "out"), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0].split() == ["layer", "head", "sink", "dist", "median", "q90", "<4", "entropy"]
    data = json.loads((tmp_path / "out" / "long_context.json").read_text())
    model = models.load(folder)
    expected = long_context_summaries(model, TEXT, layers=[0, 1], top_k=2, window=4)
    assert data["tokens"] == 50 and len(data["heads"]) == 2 * model.num_heads
    for got, want in zip(data["heads"], expected.head_table()):
        assert got == pytest.approx(want)
    top = np.load(tmp_path / "out" / "long_context_top.npz")
    assert torch.equal(torch.from_numpy(top["top_keys_1"]).long(), expected.summaries[1].top_keys)
    assert (tmp_path / "out" / "long_layer1_head0.png").stat().st_size > 1000


def test_heads_ranks_by_sink_and_retrieval(capsys, tmp_path, tiny_family_folder):
    folder = tiny_family_folder("mistral")
    code = main(["heads", TEXT, "--stat", "sink", "--model", str(folder), "--top", "3", "--out", str(tmp_path), "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    sinks = [float(line.split()[2]) for line in out.splitlines()[1:4]]
    assert sinks == sorted(sinks, reverse=True)
    data = json.loads((tmp_path / "heads_sink.json").read_text())
    assert len(data["heads"]) == 2 * 4 and data["stat"] == "sink"
    code = main(
        ["heads", TEXT, "--stat", "window", "--window", "3", "--model", str(folder), "-q"]
        + ["--top", "8", "--out", str(tmp_path)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    within = [float(line.split()[6]) for line in out.splitlines()[1:9]]
    assert within == sorted(within, reverse=True) and len(within) == 8

    code = main(
        ["heads", "--stat", "retrieval", "--length", "60", "--depth", "0.2", "--model", str(folder)]
        + ["--out", str(tmp_path), "-q"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    model = models.load(folder)
    scores = retrieval_scores(model, needle_probe(model, length=60, depth=0.2))
    data = json.loads((tmp_path / "heads_retrieval.json").read_text())
    assert data["retrieval"]["1"] == scores.scores[1].tolist()
    assert f"copied {scores.copied} of the needle's {scores.needle_tokens} tokens" in out


def test_inspect_long_reads_only_the_start_of_a_file(capsys, tmp_path, tiny_family_folder):
    folder = tiny_family_folder("gemma3_text")
    model = models.load(folder)
    # A megabyte of words, then bytes that are not UTF-8: a run that read or decoded the
    # whole file would fail on them.
    book = tmp_path / "book.txt"
    book.write_bytes((TEXT + " w9" * 350_000).encode() + b" \xff\xfe")
    argv = ["inspect", "--long", "--file", str(book), "--model", str(folder), "--layers", "0", "--format", "json"]
    code = main([*argv, "--max-tokens", "20", "--top", "2", "--window", "4", "--out", str(tmp_path / "out"), "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads((tmp_path / "out" / "long_context.json").read_text())
    ids = model.tokenizer.encode(TEXT).ids[0][:20]
    expected = long_context_summaries(model, ids, layers=[0], top_k=2, window=4)
    assert data["tokens"] == 20
    for got, want in zip(data["heads"], expected.head_table(), strict=True):
        assert got == pytest.approx(want)
    # Without --max-tokens the text must fit the model's context: it does not, said without
    # reading further than one token past it.
    assert main([*argv, "--out", str(tmp_path / "out"), "-q"]) == 2
    assert f"the text has more tokens than {model.name}'s 64; keep fewer with --max-tokens" in capsys.readouterr().err


def test_heads_long_reads_only_the_start_of_a_file(capsys, tmp_path, tiny_family_folder):
    folder = tiny_family_folder("mistral")
    book = tmp_path / "book.txt"
    book.write_text(" ".join([TEXT] * 40) + "\n\n")
    with book.open("r+b") as f:
        f.truncate(100 * 10**6)  # 100 MB, sparse: far more than a run takes
    argv = ["heads", "--long", "--stat", "sink", "--file", str(book), "--model", str(folder), "-q"]
    assert main([*argv, "--max-tokens", "30", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "out" / "heads_sink.json").read_text())
    model = models.load(folder)
    expected = long_context_summaries(model, model.tokenizer.encode(TEXT).ids[0][:30], top_k=1)
    assert data["tokens"] == 30
    for got, want in zip(data["heads"], expected.head_table(), strict=True):
        assert got == pytest.approx(want)
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 2  # more tokens than the context
    assert "keep fewer with --max-tokens" in capsys.readouterr().err


def test_inspect_long_refuses_a_file_that_is_not_a_regular_file(capsys, tmp_path):
    for path in (os.devnull, str(tmp_path)):  # a device (as /dev/zero), a folder
        assert main(["inspect", "--long", "--file", path, "--model", "smollm2"]) == 2  # before the model loads
        assert f"--file {path} is not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "--file", "x.txt"], "--file and --max-tokens go with --long"),
        (["inspect", "--long", "--window", "0"], "--window must be at least 1"),
        (["heads", "--stat", "sink"], "--stat sink reads a long text"),
        (["heads", "--long", "--stat", "previous", "w1"], "--long ranks heads by"),
        (["heads", "--stat", "retrieval", "--depth", "2"], "--depth must be in"),
        (["heads", "--long", "--max-tokens", "0", "w1"], "--max-tokens must be at least 1"),
        (["heads", "--long", "w1", "--file", "x.txt"], "give either a TEXT or --file FILE"),
        (["heads", "--long", "--file", os.devnull], f"--file {os.devnull} is not a regular file"),
        (["heads", "--max-tokens", "5", "w1"], "--max-tokens goes with --long"),
    ],
)
def test_long_options_are_checked_before_the_model_loads(capsys, argv, message):
    assert main([*argv, "--model", "smollm2"]) != 0  # refused before the model loads
    assert message in capsys.readouterr().err


BYTE_LEVEL_TEXT = " ".join(["the", "cat", "sat", "on", "the", "mat", "and", "the", "dog", "ran"] * 3)


def test_inspect_long_writes_only_the_formats_asked_with_readable_tokens(capsys, tmp_path, byte_level_gemma3):
    from tests.viz.test_long_view import embedded

    argv = ["inspect", "--long", BYTE_LEVEL_TEXT, "--model", str(byte_level_gemma3), "--layers", "1", "-q"]
    assert main([*argv, "--format", "html", "--out", str(tmp_path / "html")]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "html").iterdir()) == ["long_context.html"]
    data = embedded((tmp_path / "html" / "long_context.html").read_text())
    assert data["tokens"][:4] == ["the", "cat", "sat", "on"] and not any("\u0120" in t for t in data["tokens"])
    assert main([*argv, "--format", "json,svg", "--out", str(tmp_path / "json")]) == 0, capsys.readouterr().err
    written = sorted(p.name for p in (tmp_path / "json").iterdir())
    assert written == ["long_context.json", "long_context_top.npz", "long_layer1_head0.svg"]
    assert main([*argv, "--format", "pdf", "--out", str(tmp_path / "pdf")]) != 0
    assert "--format takes a comma-separated list of png, svg, json, html" in capsys.readouterr().err
