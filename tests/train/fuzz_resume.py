"""The fuzz run behind ``test_fuzz_resume.py``: run as ``python -m tests.train.fuzz_resume``
in a subprocess, it limits its own address space, then lets hypothesis tamper with the
fields of a tiny training checkpoint (config, step, weights, optimizer and scheduler state,
generator states, loss records, seconds), re-saves it with a recomputed checksum, as anyone
can, and resumes the run from it with the checkpoint's own config.

Every example must resume and train one step, or raise a ``ValueError``. Any other
exception, or an allocation past the limit, fails the run with hypothesis' minimal example.
"""

from __future__ import annotations

import copy
import math
import resource
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.train.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from attnkit.train.loop import TrainConfig, run, saved_config

MEMORY_LIMIT = 3 * 2**30
EXAMPLES = 80
OUTCOMES: Counter[str] = Counter()
CONFIG = TrainConfig(
    task="reverse",
    length=4,
    symbols=6,
    d_model=8,
    heads=2,
    layers=1,
    ff=16,
    steps=6,
    batch_size=4,
    warmup=2,
    eval_size=8,
    checkpoint_every=3,
)

numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-2, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([10**9, 2**31, 2**63, 65536, 8192, 1e9, 0, -1, math.nan, math.inf]),
)
tensors = st.builds(
    lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
    st.lists(st.integers(0, 6), max_size=3).map(tuple),
    st.sampled_from([torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool]),
    st.sampled_from([0.0, 1.0, -3.0, math.nan, math.inf]),
)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=6), tensors),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=2)),
    max_leaves=4,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (a tuple of keys and indices) into the nested state, inner nodes too."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found += _paths(item, (*prefix, i))
    return found


def _edit(state: Any, path: tuple, value: Any, delete: bool) -> None:
    """Set (or delete) the entry at ``path``; a tuple on the way becomes a list."""
    parent = state
    for key in path[:-1]:
        child = parent[key]
        if isinstance(child, tuple):
            child = parent[key] = list(child)
        parent = child
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    elif delete and isinstance(parent, list):
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value


def fuzz_resume(base: Path, pristine: dict[str, Any], paths: list[tuple]) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        edits=st.lists(st.tuples(st.sampled_from(paths), values, st.booleans()), min_size=1, max_size=3),
    )
    def resume_tampered(edits: list[tuple[tuple, Any, bool]]) -> None:
        folder = Path(tempfile.mkdtemp(dir=base))
        try:
            state = copy.deepcopy(pristine)
            for path, value, delete in edits:
                try:
                    _edit(state, path, value, delete)
                except (KeyError, IndexError, TypeError):
                    pass  # an earlier edit removed or replaced the way there
            save_checkpoint(state, folder / CHECKPOINT_NAME)
            try:
                config = saved_config(folder)
                run(config, folder, resume=True, stop_after=min(config.steps, state["step"] + 1), progress=False)
            except ValueError as err:
                assert str(err), "an empty error message"
                OUTCOMES["refused"] += 1
                return
            OUTCOMES["resumed"] += 1
        finally:
            shutil.rmtree(folder)

    resume_tampered()


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        run(CONFIG, base / "pristine", stop_after=3, progress=False, threads=1)
        pristine = load_checkpoint(base / "pristine" / CHECKPOINT_NAME)
        paths = [p for p in _paths(pristine) if p[:2] != ("optimizer", "param_groups") or len(p) <= 4]
        fuzz_resume(base, pristine, paths)
    print(f"fuzzed {EXAMPLES} training checkpoints under a {MEMORY_LIMIT >> 30} GiB address-space limit: {OUTCOMES}")


if __name__ == "__main__":
    main()
