"""`attnkit pe`: the notes' pictures and numbers, and clear errors."""

from __future__ import annotations

import re

import pytest

from attnkit.cli import main


def printed_number(out: str, label: str) -> float:
    """The number printed right after ``label``."""
    found = re.search(re.escape(label) + r"([\d,]+\.\d+)", out)
    assert found, f"{label!r} is not in the output:\n{out}"
    return float(found.group(1).replace(",", ""))


def pe(capsys, *argv):
    code = main(["pe", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_the_notes_pictures_and_numbers(capsys, tmp_path) -> None:
    code, out, err = pe(capsys, "--d-model", "512", "--out", str(tmp_path), "--max-distance", "200")
    assert code == 0, err
    names = ["pe_positions_3_4.png", "pe_positions_3_500.png", "pe_dimensions.png", "pe_similarity.png"]
    for name in names:
        assert f"wrote {tmp_path / name}" in out
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
        assert (tmp_path / name).stat().st_size < 200_000
    # Positions 3 and 4 are alike, 3 and 500 are not (notes 004, pictures 3 and 4).
    # Sums of 512 products: compared within one unit of the printed last digit, which another
    # processor may round the other way.
    assert printed_number(out, "cosine similarity of PE(3) and PE(4): ") == pytest.approx(0.9731, abs=1e-4)
    assert printed_number(out, "cosine similarity of PE(3) and PE(500): ") == pytest.approx(0.2763, abs=1e-4)
    # Dimension 0 turns every 2π positions, dimension 511 about every 60,000 (picture 5).
    assert printed_number(out, "dimension 0: period ") == pytest.approx(6.3, abs=0.1)
    assert printed_number(out, "dimension 511: period ") == pytest.approx(60_611.5, abs=0.1)
    assert "(depends on Δ only)" in out


def test_options(capsys, tmp_path) -> None:
    code, out, err = pe(
        capsys,
        "--d-model",
        "32",
        "--out",
        str(tmp_path),
        "--pairs",
        "1:2",
        "--dims",
        "0,31",
        "--max-position",
        "20",
        "--max-distance",
        "5",
        "--head-dim",
        "8",
    )
    assert code == 0, err
    assert "PE(1) and PE(2)" in out and "dimension 31:" in out and "Δ=1" in out and "Δ=10" not in out
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["pe_dimensions.png", "pe_positions_1_2.png", "pe_similarity.png"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--d-model", "7"],
            "--d-model must be even and at least 2 (each position is written as sine and cosine pairs), got 7",
        ),
        (["--d-model", "511"], "--d-model must be even and at least 2"),
        (["--dims", "0,600"], r"dimensions must be in [0, 512)"),
        (["--max-distance", "0"], "max_distance and max_position must be >= 1"),
        (["--pairs", "3:-4"], "positions must be >= 0"),
        (["--head-dim", "3"], "head_dim must be even"),
    ],
)
def test_bad_options(capsys, tmp_path, argv, message) -> None:
    code, _, err = pe(capsys, "--out", str(tmp_path), *argv)
    assert code == 2 and err.startswith("attnkit: error: ") and message in err


def test_malformed_lists_and_unwritable_output(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["pe", "--out", str(tmp_path), "--pairs", "3-4"])
    assert "expected pairs like 3:4,3:500" in capsys.readouterr().err
    (tmp_path / "file").write_text("not a directory")
    code, _, err = pe(capsys, "--d-model", "16", "--out", str(tmp_path / "file" / "pe"), "--max-distance", "5")
    assert code == 2 and "cannot write to" in err
