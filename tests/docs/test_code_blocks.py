"""Every code block of README.md and docs/ runs, so that the documentation cannot drift from
what the code does.

- ``python`` blocks run in order, one namespace per file.
- ``console`` blocks are transcripts: each ``$ command`` runs, and every line shown after it
  must appear, in order, in what the command prints (stdout and stderr, as a terminal shows
  them). Timings and file sizes are compared as placeholders and progress bars are left
  out. Text and whole numbers must match exactly; a number with decimals may differ by one
  unit in its last shown digit (another processor sums floats in another order and may round
  the other way), and a training run's figures by the tolerances of :data:`TRAINED`.
- ``sh`` and ``bash`` blocks are commands to run; each must succeed.
- ``json`` blocks must parse, as one document or one per line. Blocks without a language,
  or ``text``, are text (a layout, a formula, a usage line, an excerpt with elisions) and
  are not run.

Commands run in a temporary folder, ``attnkit`` inside this process (with the session's
real models, loaded once), ``attnkit serve`` as its own process until it says where to
look. The few commands that cannot run here are listed in :data:`NOT_RUN`, each with why.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Commands shown in the documentation that this suite does not run, and why.
NOT_RUN = {
    "make test": "the test suite itself",
    "--rdzv-endpoint node0.example": "needs two machines that meet at a rendezvous host",
    "--model TinyLlama/": "downloads 2.2 GB from the Hugging Face Hub, which tests never reach (tests/models/"
    "test_hub.py loads Hugging Face names from cache layouts it writes)",
}
# Pages whose blocks train models for minutes or survey every head of SmolLM2.
SLOW_PAGES = {"training.md", "inspect.md", "korean-and-words.md", "distributed.md", "analysis.md", "long-contexts.md"}
# Pages whose python blocks a test of their own runs, comparing what they print with the page.
OWN_TEST = {"ioi.md": "tests/docs/test_ioi_page.py"}
# The texts the documentation's `--file texts.txt` surveys.
TEXTS_TXT = "The cat sat on the mat.\nThe animal didn't cross the road because it was too tired.\n"

# A text file the README's `attnkit explain --input mine.json` reads.
MINE_JSON = {
    "tokens": ["I", "like", "tea"],
    "q": [[1, 0], [0, 1], [1, 1]],
    "k": [[1, 0], [0, 1], [1, 1]],
    "v": [[1, 2], [3, 4], [5, 6]],
}


@dataclass(frozen=True)
class Block:
    """One fenced code block."""

    page: Path
    line: int
    language: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the line each starts on."""
    text = page.read_text(encoding="utf-8")
    return [
        Block(page, text[: m.start()].count("\n") + 1, m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
    ]


ALL_BLOCKS = [block for page in PAGES for block in code_blocks(page)]


# ---------------------------------------------------------------- comparing output

_PROGRESS = re.compile(r"\d+/\d+ \[|it/s|step/s|█")
_DURATION = re.compile(r"\b\d+(?:\.\d+)?(?:–\d+(?:\.\d+)?)? ?(?:ms|s|min)\b")
_SIZE = re.compile(r"\(\d+(?:\.\d+)? ?[kMG]?B\)")


# The model cache as the documentation shows it (root's default) and as this machine has it
# ($ATTNKIT_HOME or ~/.cache/attnkit): both compare as one placeholder.
_DOCUMENTED_CACHE = "/root/.cache/attnkit"


def _cache_placeholder(line: str) -> str:
    from attnkit.models.checkpoints.registry import home

    return line.replace(str(home()), "CACHE").replace(_DOCUMENTED_CACHE, "CACHE")


def normalized(output: str) -> list[str]:
    """Lines to compare: trailing spaces gone, durations, sizes and the model cache's folder
    as placeholders, progress bars and blank lines left out."""
    lines = []
    for line in output.splitlines():
        if not line.strip() or _PROGRESS.search(line):
            continue
        line = _cache_placeholder(_SIZE.sub("(SIZE)", _DURATION.sub("T", line.rstrip())))
        lines.append(line)
    return lines


# A number with decimals, as the commands print them ("0.38", "-2.2524", "+0.5838", "−7.57",
# "1,386.5"); a version or an address ("2.13.0", "127.0.0.1") is text.
_DECIMAL = re.compile(r"(?<![\w.])([-+−]?\d{1,3}(?:,\d{3})*\.\d+|[-+−]?\d+\.\d+)(?![\w.])")


@dataclass(frozen=True)
class TrainedFigures:
    """Lines whose numbers a training run computes. Another processor's floating-point path
    (vector width, threads) takes a run elsewhere by a little, so each decimal number of such a
    line may differ from the documented one by up to ``tolerance`` (in the line's own units)."""

    line: re.Pattern[str]
    tolerance: float
    # Which head comes out best may differ where several heads are about equally good: the
    # layer and head it names are placeholders, its fraction is still compared.
    placeholders: re.Pattern[str] | None = None


TRAINED = [
    # the first loss (before any step) and the loss of the last steps
    TrainedFigures(re.compile(r"training loss: "), tolerance=0.001),
    # percentages of the held-out examples
    TrainedFigures(re.compile(r"held-out exact match: "), tolerance=0.5),
    # each head's fraction of queries whose most-attended input lies on the pattern
    TrainedFigures(re.compile(r" *layer \d+: head \d+: "), tolerance=0.05),
    TrainedFigures(re.compile(r"best head: "), tolerance=0.5, placeholders=re.compile(r"\d+(?=,)|(?<=head )\d+")),
]


def _decimal(text: str) -> float:
    return float(text.replace("−", "-").replace(",", ""))


def _last_digit(text: str) -> float:
    return 10.0 ** -len(text.rsplit(".", 1)[1])


def shows(expected: str, actual: str, elided: bool = False) -> bool:
    """Whether the line ``actual`` shows the documented line ``expected`` (or, ``elided``,
    starts with it): text and whole numbers equal, numbers with decimals within one unit of
    their last shown digit, or within the tolerance of :data:`TRAINED` on a training run's
    lines."""
    trained = next((rule for rule in TRAINED if rule.line.match(expected)), None)
    if trained is not None and trained.placeholders is not None:
        expected, actual = trained.placeholders.sub("N", expected), trained.placeholders.sub("N", actual)
    # text, number, text, number, ..., text
    expected_parts, actual_parts = _DECIMAL.split(expected), _DECIMAL.split(actual)
    if len(expected_parts) > len(actual_parts) or (not elided and len(expected_parts) != len(actual_parts)):
        return False
    last = len(expected_parts) - 1
    for i, (shown, printed) in enumerate(zip(expected_parts, actual_parts)):
        if i % 2 == 0:
            if not (printed.startswith(shown) if elided and i == last else printed == shown):
                return False
            continue
        tolerance = max(_last_digit(shown), _last_digit(printed), trained.tolerance if trained else 0.0)
        # 1e-9: the decimal numbers' own rounding when subtracted
        if abs(_decimal(shown) - _decimal(printed)) > tolerance + 1e-9:
            return False
    return True


def assert_shown_in(expected: str, actual: str, command: str) -> None:
    """Every line of ``expected`` appears in ``actual``, in order (placeholders aside, numbers
    as :func:`shows` compares them); a line that ends in ``...`` or ``…`` stands for the lines
    that start with what it shows."""
    remaining = iter(normalized(actual))
    for line in normalized(expected):
        if line.strip() in ("…", "...", "[…]"):
            continue
        prefix = line.removesuffix("...").removesuffix("…").rstrip()
        elided = prefix != line
        if not any(shows(prefix, candidate, elided) for candidate in remaining):
            raise AssertionError(f"`{command}` did not print, in this order, the line\n  {line}\nIt printed:\n{actual}")


# ---------------------------------------------------------------- running commands


@contextlib.contextmanager
def environment(changes: dict[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def split_command(line: str) -> tuple[dict[str, str], list[str]]:
    """``NAME=value ... program args`` as the environment changes and the argv."""
    words = shlex.split(line, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def run_attnkit(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``attnkit ARGV`` in this process: exit status and what it printed (stdout and stderr
    interleaved, as in a terminal)."""
    from attnkit.cli import main

    printed = io.StringIO()
    with environment(env), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(argv)
    return code, printed.getvalue()


def run_serve(argv: list[str]) -> tuple[int, str]:
    """``attnkit serve ARGV`` as its own process, on a free port, until it says where to
    look; then it is stopped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if "--port" in argv:
        argv = [*argv[: argv.index("--port")], *argv[argv.index("--port") + 2 :]]
    server = subprocess.Popen(
        [sys.executable, "-m", "attnkit", "serve", *argv, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line)
            if "open http://" in line or time.monotonic() > deadline:
                break
    finally:
        server.terminate()
        server.wait(timeout=30)
    printed = "".join(lines)
    return (0 if f"open http://127.0.0.1:{port}/" in printed else 1), printed


def run_make(target: str, env: dict[str, str]) -> list[tuple[list[str], int, str]]:
    """The ``attnkit`` commands of a Makefile target's recipe, each run in this process."""
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, f"the Makefile has no target {target!r}"
    results = []
    for line in recipe.group(1).splitlines():
        _, words = split_command(line.strip().replace("$(BIN)/", ""))
        assert words[0] == "attnkit", f"make {target} runs {line.strip()!r}, which this test does not know"
        results.append((words, *run_attnkit(words[1:], env)))
    return results


# Commands that appear on several pages and read no file that an earlier command of their
# block wrote run once per session; the output of the first run stands for the others.
RUN_ONCE = (
    "attnkit train --task reverse --out runs/reverse",
    'attnkit heads "The animal didn\'t cross the road because it was too tired." --from it --to animal',
)
# Those that train for minutes run in a process of their own, started when the session
# starts (tests/docs/conftest.py): they train on one core while the other tests run.
RUN_IN_BACKGROUND = ("attnkit train --task reverse --out runs/reverse",)
_ran_once: dict[str, tuple[int, str]] = {}
_running: dict[str, subprocess.Popen[str]] = {}


def start_in_background(blocks: list[Block], where: Path) -> None:
    """Start each command of :data:`RUN_IN_BACKGROUND` that ``blocks`` run as its own process
    in ``where``: ``python -u -m attnkit ...``, stdout and stderr in one pipe, in the order
    printed, as a terminal shows them."""
    for command in RUN_IN_BACKGROUND:
        if command in _running or not any(command in " ".join(block.text.split()) for block in blocks):
            continue
        env, words = split_command(command)
        assert words[0] == "attnkit", command
        _running[command] = subprocess.Popen(
            [sys.executable, "-u", "-m", "attnkit", *words[1:]],
            cwd=where,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def stop_background() -> None:
    """Stop what :func:`start_in_background` started and no test waited for."""
    for process in _running.values():
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    _running.clear()


# Model folders that several blocks of a page read, made once per session: by a documented
# command (run as the page shows it, its output kept for the block that shows it), or by
# a page's python blocks. A console or sh block that names one runs where a copy of it is.
PREPARED_FOLDERS = {
    "runs/reverse-8": (
        "attnkit train --task reverse --out runs/reverse-8 --length 8 --symbols 10 --d-model 32 --heads 2 "
        "--ff 64 --layers 1 --steps 300 --warmup 30 --eval-size 200 --no-progress"
    ),
    "tiny-t5": "encoder-decoder.md",
}
_prepared: dict[str, Path] = {}


def prepare_folders(text: str, here: Path, session: pytest.TempPathFactory) -> None:
    """Copy into ``here`` every folder of :data:`PREPARED_FOLDERS` that ``text`` names,
    making it first if this session has not."""
    for name, made_by in PREPARED_FOLDERS.items():
        if not re.search(rf"{re.escape(name)}(?![\w-])", text):
            continue
        if name not in _prepared:
            where = session.mktemp(name.replace("/", "-"))
            with contextlib.chdir(where):
                if made_by.endswith(".md"):
                    namespace: dict = {"__name__": f"docs_{Path(made_by).stem}"}
                    for block in code_blocks(ROOT / "docs" / made_by):
                        if block.language == "python":
                            run_python_block(block, namespace)
                else:
                    code, printed = _ran_once[made_by] = _run_command(made_by)
                    assert code == 0, f"`{made_by}` exited {code}:\n{printed}"
            _prepared[name] = where / name
        shutil.copytree(_prepared[name], here / name, dirs_exist_ok=True)


def run_command(line: str) -> tuple[int, str]:
    """One documented command: its exit status and output."""
    command = " ".join(line.split("#")[0].split())  # as one line, however the page wraps it
    if command in RUN_ONCE or command in _ran_once:
        if command not in _ran_once and command in _running:
            printed, _ = _running[command].communicate(timeout=1800)
            _ran_once[command] = _running.pop(command).returncode, printed
        elif command not in _ran_once:
            _ran_once[command] = _run_command(command)
        return _ran_once[command]
    return _run_command(line)


def run_process(words: list[str], env: dict[str, str]) -> tuple[int, str]:
    """A command as its own process: ``torchrun`` from this environment, or ``attnkit``
    when it starts processes of its own (``--nproc``), whose output this process cannot
    capture."""
    if words[0] == "attnkit":
        argv = [sys.executable, "-m", "attnkit", *words[1:]]
    else:
        program = Path(sys.executable).with_name(words[0])
        assert program.exists(), f"{words[0]} is not installed beside {sys.executable}"
        argv = [str(program), *words[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env={**os.environ, **env})
    return done.returncode, done.stdout + done.stderr


def _run_command(line: str) -> tuple[int, str]:
    env, words = split_command(line)
    if words[0] == "torchrun" or "--nproc" in words:
        return run_process(words, env)
    if words[0] == "attnkit" and words[1:2] == ["serve"]:
        return run_serve(words[2:])
    if words[0] == "attnkit":
        return run_attnkit(words[1:], env)
    if words[0] == "make" and len(words) == 2:
        outputs = run_make(words[1], env)
        return max(code for _, code, _ in outputs), "".join(out for _, _, out in outputs)
    raise AssertionError(f"the documentation runs {line!r}; teach this test how to run it, or list it in NOT_RUN")


def not_run(line: str) -> bool:
    return any(command in line for command in NOT_RUN)


def console_steps(text: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` of a console transcript: lines after ``$ ``, a command
    going on over lines that end in a backslash; ``#`` lines before the first command are
    comments."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if continued:
            steps[-1] = (steps[-1][0][:-1] + " " + line.strip(), [])
        elif line.startswith("$ "):
            steps.append((line[2:].rstrip(), []))
        elif steps:
            steps[-1][1].append(line)
        elif not line.startswith("#"):
            raise AssertionError(f"a console block must start with a prompt, got {line!r}")
        continued = bool(steps) and not steps[-1][1] and steps[-1][0].endswith("\\")
    return [(command, "\n".join(output)) for command, output in steps]


def shell_commands(text: str) -> list[str]:
    """The commands of a ``sh`` block: one per line (or over lines that end in a
    backslash), comments and blank lines left out."""
    commands: list[str] = []
    for line in text.splitlines():
        if commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1] + " " + line.strip()
        elif line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.rstrip())
    return commands


# ---------------------------------------------------------------- the tests


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch) -> Path:
    """A temporary working folder with the files the documentation assumes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.json").write_text(json.dumps(MINE_JSON))
    (tmp_path / "texts.txt").write_text(TEXTS_TXT)
    return tmp_path


# The variables that decide which cached model a load finds, and whether it may load, as the
# session started: the suite itself may run with its own ATTNKIT_HOME (.ci/run starts it with
# an empty one), a documented command that sets one runs with another.
def _model_environment() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ("ATTNKIT_HOME", "ATTNKIT_MEMORY_LIMIT")}


_SESSION_ENVIRONMENT = _model_environment()


def models_the_block_reads(text: str) -> list[str]:
    """The known models whose cache a block's ``attnkit models fetch`` and ``models list``
    commands show, in the registry's order: those named, or all of them where none is."""
    from attnkit.models import MODELS

    read: set[str] = set()
    for line in text.splitlines():
        words = line.removeprefix("$ ").split("#")[0].split()
        if words[:3] in (["attnkit", "models", "fetch"], ["attnkit", "models", "list"]):
            named = [word for word in words[3:] if word in MODELS]
            read.update(named if named and words[2] == "fetch" else MODELS)
    return [name for name in MODELS if name in read]


def fetch_models_the_block_reads(text: str) -> None:
    """Fetch, before a block runs, every model its ``models fetch``/``models list`` commands
    show, so that the block prints the same on a machine that has fetched nothing (each
    "already fetched", every model listed) as on one that fetched them before the session."""
    from attnkit import models

    for name in models_the_block_reads(text):
        models.fetch(name, progress=False)


@pytest.fixture
def shared_models(smollm2, minilm, monkeypatch):
    """``attnkit.models.load`` of a known model on the CPU returns the session's model,
    loaded once; anything else loads as usual."""
    from attnkit import models
    from attnkit.models import loading

    original = loading.load
    session = {"smollm2": smollm2, "minilm": minilm}

    def load(name_or_path, *args, **kwargs):
        # A command run with another model cache or a memory limit (checked at load) loads for itself.
        known = str(name_or_path) in session and _SESSION_ENVIRONMENT == _model_environment()
        as_loaded = (
            kwargs.get("revision") is None
            and kwargs.get("dtype", "auto") in ("auto", "float32")
            and str(kwargs.get("device", "cpu")) == "cpu"
        )
        if known and not args and as_loaded and set(kwargs) <= {"device", "revision", "dtype"}:
            return session[str(name_or_path)]
        return original(name_or_path, *args, **kwargs)

    monkeypatch.setattr(models, "load", load)
    monkeypatch.setattr(loading, "load", load)


def page_blocks(language_set: set[str]) -> list:
    return [
        pytest.param(block, id=block.id, marks=[pytest.mark.slow] if block.page.name in SLOW_PAGES else [])
        for block in ALL_BLOCKS
        if block.language in language_set
    ]


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, id=p.name)
        for p in PAGES
        if any(b.language == "python" for b in code_blocks(p)) and p.name not in OWN_TEST
    ],
)
def test_python_blocks_run(page, in_tmp, shared_models):
    blocks = [block for block in code_blocks(page) if block.language == "python"]
    if any("attnkit.distributed" in block.text and re.search(r"\.init\(", block.text) for block in blocks):
        # A script that joins a process group: run as torchrun runs it, on two processes.
        script = in_tmp / f"{page.stem}.py"
        script.write_text("\n\n".join(block.text for block in blocks), encoding="utf-8")
        code, printed = run_process(["torchrun", "--standalone", "--nproc-per-node", "2", str(script)], {})
        assert code == 0, f"the python blocks of {page.name}, run by torchrun on 2 processes, failed:\n{printed}"
        return
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for block in blocks:
        try:
            run_python_block(block, namespace)
        except Exception as err:
            raise AssertionError(f"the python block at {block.id} failed: {err!r}") from err


def run_python_block(block: Block, namespace: dict) -> None:
    """Run a python block statement by statement. A statement that is only an expression
    must not make a generator: pasted into a script (or a notebook, unless last) it would
    run nothing and show nothing. A statement whose line ends in a shape comment of numbers
    (``x = f(y)  # [31, 1, 5, 576]``) must give a value of that shape."""
    filename = f"{block.page.name}:{block.line}"
    lines = block.text.splitlines()
    for statement in ast.parse(block.text, filename).body:
        value = None
        if isinstance(statement, ast.Expr):
            value = eval(compile(ast.Expression(statement.value), filename, "eval"), namespace)
            if isinstance(value, types.GeneratorType):
                raise AssertionError(
                    f"line {block.line + statement.lineno} of {block.page.name} makes a generator and drops it: "
                    "print it, join it or loop over it"
                )
        else:
            exec(compile(ast.Module([statement], type_ignores=[]), filename, "exec"), namespace)
            value = _assigned(statement, namespace)
        end = statement.end_lineno or statement.lineno
        _check_shape_comment(lines[end - 1], value, f"line {block.line + end} of {block.page.name}")


# A comment that states a shape in numbers: "# [31, 1, 5, 576]" (shapes in letters,
# "# [b, h, s, s]", are read, not checked).
_SHAPE_COMMENT = re.compile(r"#\s*\[(\d+(?:,\s*\d+)*)\]")


def _assigned(statement: ast.stmt, namespace: dict) -> object:
    """The value an assignment gave its (first) name, or ``None``."""
    if not isinstance(statement, ast.Assign):
        return None
    target = statement.targets[0]
    if isinstance(target, ast.Tuple) and target.elts:
        target = target.elts[0]
    return namespace.get(target.id) if isinstance(target, ast.Name) else None


def _check_shape_comment(line: str, value: object, where: str) -> None:
    """Raise when ``line`` ends in a shape comment of numbers that ``value`` (a tensor, or
    a shape itself: ``x.shape  # [1, 7, 576]``) contradicts."""
    _, hash_, comment = line.partition("  #")
    found = _SHAPE_COMMENT.match(f"#{comment}") if hash_ else None
    shape = getattr(value, "shape", value)
    if found is None or not isinstance(shape, tuple) or not all(isinstance(n, int) for n in shape):
        return
    stated = tuple(int(n) for n in found.group(1).split(","))
    if tuple(shape) != stated:
        raise AssertionError(f"{where} says the shape is {list(stated)}, but the run gives {list(shape)}")


def fence_problems(text: str) -> list[str]:
    """What is wrong with the code fences of a Markdown page: every block opens with a
    language (``text`` for text) and closes with a bare fence, so a bare fence where a
    block would open means one closed too early above, and a fence left open at the end
    swallows the page."""
    problems, opened = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("```"):
            continue
        if opened is None and line == "```":
            problems.append(f"line {number}: a bare fence opens a block (a block above closed early?)")
        elif opened is not None and line != "```":
            problems.append(f"line {number}: {line!r} inside the block of line {opened}")
        opened = number if opened is None else None
    if opened is not None:
        problems.append(f"line {opened}: this block never closes")
    return problems


@pytest.mark.parametrize("page", [pytest.param(p, id=p.name) for p in PAGES])
def test_code_fences_are_balanced(page):
    assert fence_problems(page.read_text(encoding="utf-8")) == []


def test_an_early_closing_fence_is_caught():
    page = "```python\nx = 1\n```\n# a comment that was meant as code\nx = 2\n```\n\nProse.\n"
    assert fence_problems(page) == [
        "line 6: a bare fence opens a block (a block above closed early?)",
        "line 6: this block never closes",
    ]


def test_a_shape_comment_the_run_contradicts_is_caught():
    block = Block(ROOT / "README.md", 1, "python", "import torch\nx = torch.zeros(2, 3)  # [2, 4]: rows, columns\n")
    with pytest.raises(AssertionError, match=r"says the shape is \[2, 4\], but the run gives \[2, 3\]"):
        run_python_block(block, {})
    size = Block(ROOT / "README.md", 1, "python", "import torch\ntorch.zeros(2, 3).shape  # [3, 2]\n")
    with pytest.raises(AssertionError, match=r"line 3 of README.md says the shape is \[3, 2\]"):
        run_python_block(size, {})
    right = Block(ROOT / "README.md", 1, "python", "import torch\nx, y = torch.zeros(2, 3), 1  # [2, 3]\n")
    run_python_block(right, {})


@pytest.mark.parametrize("block", page_blocks({"console"}))
def test_console_transcripts(block, in_tmp, shared_models, tmp_path_factory):
    prepare_folders(block.text, in_tmp, tmp_path_factory)
    fetch_models_the_block_reads(block.text)
    for command, expected in console_steps(block.text):
        if not_run(command):
            continue
        code, printed = run_command(command)
        error_shown = any(line.startswith("attnkit: error:") for line in expected.splitlines())
        assert (code != 0) == error_shown, f"`{command}` ({block.id}) exited {code}:\n{printed}"
        assert_shown_in(expected, printed, command)


@pytest.mark.parametrize("block", page_blocks({"sh", "bash"}))
def test_shell_commands(block, in_tmp, shared_models, tmp_path_factory):
    prepare_folders(block.text, in_tmp, tmp_path_factory)
    fetch_models_the_block_reads(block.text)
    for command in shell_commands(block.text):
        if not_run(command):
            continue
        code, printed = run_command(command)
        assert code == 0, f"`{command}` ({block.id}) exited {code}:\n{printed}"


def test_a_block_that_shows_the_model_cache_has_what_it_shows_fetched_first():
    """``attnkit models fetch`` prints "already fetched" only for a model fetched before: the
    models a block shows are fetched before it runs, so that a machine that has fetched
    nothing (a newcomer's, or CI's empty ATTNKIT_HOME) prints what the page shows."""
    every = ["smollm2", "minilm", "gemma3"]
    assert (
        models_the_block_reads("$ attnkit models fetch            # all three; or: attnkit models fetch smollm2")
        == every
    )
    assert models_the_block_reads("$ attnkit models fetch all") == every
    assert models_the_block_reads("$ attnkit models fetch gemma3 smollm2\nsmollm2: fetched") == ["smollm2", "gemma3"]
    assert models_the_block_reads("$ attnkit models list") == every
    assert models_the_block_reads('$ attnkit inspect "The cat sat on the mat."') == []
    listing = [
        block for block in ALL_BLOCKS if block.page.name == "models.md" and "$ attnkit models list" in block.text
    ]
    assert [models_the_block_reads(block.text) for block in listing] == [every]


@pytest.mark.parametrize("block", page_blocks({"json"}))
def test_json_blocks_parse(block):
    try:
        json.loads(block.text)
    except json.JSONDecodeError:
        for line in block.text.splitlines():
            json.loads(line)


def test_every_block_has_a_known_language():
    known = {"python", "console", "sh", "bash", "json", "text", ""}
    assert {block.id: block.language for block in ALL_BLOCKS if block.language not in known} == {}


# ---------------------------------------------------------------- the comparison itself


def test_a_training_run_elsewhere_shows_the_documented_transcript():
    documented = """\
training loss: 3.6611 → 0.0000 in 1000 steps, 117.1 s
held-out exact match: 100.00% of 1000 (token accuracy 100.00%)
  layer 0: head 0: 0.99  head 1: 1.00  head 2: 1.00  head 3: 1.00
best head: layer 0, head 2 (99.96%)"""
    # what another machine of the same kind printed: head 1 came out 0.99
    elsewhere = """\
training loss: 3.6612 → 0.0002 in 1000 steps, 121.4 s
held-out exact match: 99.90% of 1000 (token accuracy 99.99%)
  layer 0: head 0: 0.99  head 1: 0.99  head 2: 1.00  head 3: 1.00
best head: layer 0, head 3 (99.93%)"""
    assert_shown_in(documented, elsewhere, "attnkit train")


@pytest.mark.parametrize(
    "printed",
    [
        "training loss: 3.6611 → 0.0020 in 1000 steps, 117.1 s",  # the loss of the last steps
        "training loss: 3.6611 → 0.0000 in 999 steps, 117.1 s",  # a count
        "held-out exact match: 98.00% of 1000 (token accuracy 100.00%)",
        "  layer 0: head 0: 0.90  head 1: 1.00",  # beyond the tolerance
        "  layer 1: head 0: 0.99  head 1: 1.00",  # another layer
        "best head: layer 0, head 2 (97.00%)",
    ],
)
def test_a_training_run_that_went_elsewhere_does_not(printed):
    documented = {
        "training": "training loss: 3.6611 → 0.0000 in 1000 steps, 117.1 s",
        "held-out": "held-out exact match: 100.00% of 1000 (token accuracy 100.00%)",
        "  layer": "  layer 0: head 0: 0.99  head 1: 1.00",
        "best head": "best head: layer 0, head 2 (99.96%)",
    }
    line = next(line for start, line in documented.items() if printed.startswith(start))
    with pytest.raises(AssertionError, match="did not print"):
        assert_shown_in(line, printed, "attnkit train")


@pytest.mark.parametrize(
    ("documented", "printed", "shown"),
    [
        # a float sum rounded the other way: one unit in the last digit
        ("     4  the    the 0.38  The 0.26", "     4  the    the 0.37  The 0.26", True),
        ("    1     4  -0.8484", "    1     4  -0.8485", True),
        ("unablated log p(' animal') = −7.57", "unablated log p(' animal') = −7.58", True),
        ("dimension 300: period 1,386.5 positions", "dimension 300: period 1,386.4 positions", True),
        # more than that is another result
        ("     4  the    the 0.38  The 0.26", "     4  the    the 0.36  The 0.26", False),
        ("    1     4  -0.8484", "    1     4  +0.8484", False),
        # whole numbers, tokens and words are exact
        ("     4  the    the 0.38", "     5  the    the 0.38", False),
        ("     4  the    the 0.38", "     4  the    The 0.38", False),
        ("parameters: 671,266", "parameters: 671,267", False),
        ("torch 2.13.0", "torch 2.14.0", False),
        ("  layer 0: head 0: 0.99", "  layer 0: head 0: 0.99  head 1: 1.00", False),
    ],
)
def test_numbers_with_decimals_compare_within_their_last_digit(documented, printed, shown):
    assert shows(documented, printed) is shown


def test_an_elided_line_compares_what_it_shows():
    assert shows("  layer 0: head 0: 0.99", "  layer 0: head 0: 1.00  head 1: 1.00", elided=True)
    assert not shows("  layer 0: head 0: 0.99", "  layer 1: head 0: 0.99  head 1: 1.00", elided=True)
    assert shows("reverse: encoder-decoder, 2+2", "reverse: encoder-decoder, 2+2 layers", elided=True)
