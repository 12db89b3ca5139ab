"""What the commands share: a mistyped model fails at once, sizes, status lines, warnings."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from attnkit.cli import CommandError, main
from attnkit.cli.common import (
    Status,
    check_model_name,
    check_sizes,
    format_size,
    model_names_in,
    parse_size,
)


def test_the_task_names_kept_without_torch_match_the_library():
    from attnkit.train.config import TASK_NAMES
    from attnkit.train.tasks import TASKS

    assert TASK_NAMES == tuple(TASKS)


def test_a_mistyped_model_fails_before_torch_is_imported():
    script = (
        "import sys\n"
        "from attnkit.cli import main\n"
        "code = main(['inspect', 'hi', '--model', 'smolm2'])\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"]
    assert done.stderr == (
        "attnkit: error: --model 'smolm2' is neither a known model (smollm2, minilm, gemma3), a folder, nor a Hugging Face name ORG/NAME; "
        "did you mean 'smollm2'?\n"
    )


# Each command line ends in an error that its options alone decide.
ARGUMENT_ERRORS = [
    ["inspect", "x", "--method", "grad"],
    ["inspect", "x", "--top", "0"],
    ["inspect", "x", "--format", "gif"],
    ["heads", "x", "--top", "0"],
    ["heads", "x", "--ablate", "--from", "it"],
    ["heads", "x", "--nproc", "0"],
    ["patch", "--clean", " ", "--corrupt", "b"],
    ["pe", "--out", "o", "--d-model", "3"],
    ["train", "--out", "o", "--threads", "0"],
    ["train", "--out", "o", "--task", "fly"],
    ["generate"],
]


def test_help_and_argument_errors_come_before_torch_is_imported():
    # What a command needs to check its options is importable without PyTorch (seconds).
    script = (
        "import contextlib, io, json, sys\n"
        "from attnkit.cli import main\n"
        "results = []\n"
        f"for argv in [['--help'], ['inspect', '--help'], ['heads', '--help'], *{ARGUMENT_ERRORS!r}]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "        try:\n"
        "            code = main(argv)\n"
        "        except SystemExit as exit:\n"
        "            code = exit.code\n"
        "    results.append([argv, code, err.getvalue()])\n"
        "print(json.dumps([results, [m for m in ('torch', 'numpy', 'transformers') if m in sys.modules]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    results, imported = json.loads(done.stdout)
    assert imported == []
    for argv, code, err in results:
        if argv[-1] == "--help":
            assert code == 0, (argv, err)
        else:
            assert code == 2 and err.startswith(("attnkit: error:", "usage: attnkit")), (argv, code, err)


@pytest.mark.parametrize(
    ("argv", "message", "not_said"),
    [
        (["--method", "grad"], "attnkit: error: --method grad needs --target: the next token whose", "only for"),
        (["--target", " Paris"], "attnkit: error: --target is only for --method grad, not --method raw\n", "needs"),
        (
            ["--method", "rollout", "--target", " P"],
            "--target is only for --method grad, not --method rollout",
            "needs",
        ),
    ],
)
def test_method_and_target_errors_say_only_what_applies(capsys, argv, message, not_said):
    assert main(["inspect", "x", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and not_said not in err


def test_python_dash_m_attnkit_is_the_command():
    done = subprocess.run([sys.executable, "-m", "attnkit", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("attnkit ")


def test_model_names_and_paths(tmp_path):
    assert model_names_in(["inspect", "--model", "a", "--model=b", "--modelx", "c"]) == ["a", "b"]
    check_model_name("minilm")
    check_model_name(str(tmp_path))
    check_model_name("TinyLlama/TinyLlama-1.1B-Chat-v1.0")  # a Hugging Face name: resolved at load
    with pytest.raises(CommandError, match="did you mean 'minilm'"):
        check_model_name("minlm")
    with pytest.raises(CommandError, match=r"nor a Hugging Face name ORG/NAME$"):
        check_model_name("gpt-17")


def test_sizes():
    assert parse_size("20MB") == 20_000_000 and parse_size("1.5 GB") == 1_500_000_000
    assert parse_size("500kB") == 500_000 and parse_size("123") == 123 and parse_size("none") is None
    with pytest.raises(CommandError, match="--max-size takes a size"):
        parse_size("20 parsecs")
    assert [format_size(n) for n in (12, 3_400, 3_400_000, 1_200_000_000)] == ["12 B", "3.4 kB", "3.4 MB", "1.2 GB"]
    check_sizes({"a": 10}, None, advice="x")
    check_sizes({"a": 10}, 10, advice="x")
    with pytest.raises(
        CommandError,
        match=r"^b would be about 11 B, over the 10 B limit per file, so nothing was "
        r"written\. Ask less, or raise the limit with --max-size",
    ):
        check_sizes({"a": 10, "b": 11}, 10, advice="Ask less")


def test_status_lines_go_to_stderr_unless_quiet(capsys):
    with Status().step("loading"):
        pass
    assert capsys.readouterr().err.splitlines()[0] == "attnkit: loading …"
    with Status(quiet=True).step("loading"):
        Status(quiet=True).say("x")
    assert capsys.readouterr() == ("", "")


def test_warnings_read_as_the_commands_own_lines(capsys, monkeypatch):
    import attnkit.cli.explain as explain

    def warn(args):
        warnings.warn("no installed font has glyphs for '가'", UserWarning, stacklevel=2)
        return 0

    monkeypatch.setattr(explain, "run", warn)
    assert main(["explain"]) == 0
    assert capsys.readouterr().err == "attnkit: warning: no installed font has glyphs for '가'\n"
