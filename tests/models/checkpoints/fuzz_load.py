"""The fuzz runs behind ``test_crafted.py``.

Run as ``python -m tests.models.checkpoints.fuzz_load`` in a subprocess, :func:`main` limits its own
address space, then lets hypothesis tamper with a tiny checkpoint folder (config.json
fields, the safetensors header, tokenizer.json) and load it. Every example must load and
run, or raise a :class:`attnkit.models.CheckpointError` for a file of the folder (a
``ValueError`` naming the tokenizer file for text it fails on). Any other exception, or an
allocation past the limit (a ``MemoryError`` or torch's "can't allocate memory"), fails the
run with hypothesis' minimal example.

:func:`fuzz_config_fields` gives every field of every family's ``config.json`` a value of
every JSON type in turn, reads the file and builds the network (on the ``meta`` device):
each must build, or be refused with one line naming the file and the field.
"""

from __future__ import annotations

import json
import resource
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import models
from attnkit.models.checkpoints.files import read_config
from attnkit.models.families.table import FAMILIES
from tests.fixtures.crafted import (
    FAMILY_CONFIGS,
    TINY_LLAMA_CONFIG,
    WRONG_VALUES,
    read_header,
    tokenizer_json,
    write_tiny_llama,
    write_with_header,
)

MEMORY_LIMIT = 3 * 2**30
EXAMPLES = 300
OUTCOMES: Counter[str] = Counter()

numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-2, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([10**12, 2**31, 2**63, 1e9, 0, -1]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)
config_keys = st.sampled_from(
    sorted(TINY_LLAMA_CONFIG) + ["head_dim", "rope_parameters", "rope_scaling", "attention_bias", "type_vocab_size"]
)
config_edits = st.dictionaries(config_keys, st.one_of(numbers, json_values), min_size=1, max_size=3)
header_fields = st.sampled_from(["dtype", "shape", "data_offsets"])
shapes = st.lists(st.one_of(st.just(0), st.integers(0, 2**70)), max_size=3)
header_edits = st.lists(
    st.tuples(st.integers(0, 30), header_fields, st.one_of(json_values, shapes)), min_size=1, max_size=2
)
patterns = st.sampled_from(["(a+)+$", "(\\w+\\s?)*$", "\\s+", "(", "[", "a{2,1}", "(?<=a+)b", "((((((((((a))))))))))"])
tokenizer_edits = st.one_of(
    st.tuples(st.just("pattern"), patterns),
    st.tuples(st.just("words"), st.integers(1, 40)),
    st.tuples(st.just("bytes"), st.binary(max_size=40)),
)
texts = st.sampled_from(["the cat sat", "a" * 60 + "b", "mat on the cat " * 3])


def _tamper(folder: Path, config: dict[str, Any], header: list[tuple[int, str, Any]], tokenizer: Any) -> None:
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA_CONFIG, **config}))
    if header:
        entries, data = read_header(folder / "model.safetensors")
        names = sorted(entries)
        for index, field, value in header:
            entries[names[index % len(names)]][field] = value
        write_with_header(folder / "model.safetensors", entries, data)
    if tokenizer is None:
        return
    kind, value = tokenizer
    if kind == "pattern":
        spec = tokenizer_json()
        spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": value}, "behavior": "Isolated", "invert": False}
        (folder / "tokenizer.json").write_text(json.dumps(spec))
    elif kind == "words":
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json([f"w{i}" for i in range(value)] + ["[UNK]"])))
    else:
        (folder / "tokenizer.json").write_bytes(value)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    edits=st.one_of(
        st.tuples(config_edits, st.just([]), st.none()),
        st.tuples(st.just({}), header_edits, st.none()),
        st.tuples(st.just({}), st.just([]), tokenizer_edits),
        st.tuples(config_edits, header_edits, tokenizer_edits),
    ),
    text=texts,
)
def fuzz_load(base: Path, edits: tuple[dict[str, Any], list[tuple[int, str, Any]], Any], text: str) -> None:
    folder = Path(tempfile.mkdtemp(dir=base))
    shutil.copytree(base / "pristine", folder, dirs_exist_ok=True)
    _tamper(folder, *edits)
    try:
        model = models.load(folder)
    except models.CheckpointError as err:
        assert err.path.parent == folder, err
        assert str(err).startswith(str(err.path)), err
        if err.path.name == "config.json" and "not valid JSON" not in str(err):
            assert err.field is not None, err
        OUTCOMES[f"refused: {err.path.name}"] += 1
        return
    finally:
        shutil.rmtree(folder)
    try:
        model.run(text)
        "".join(model.generate(text, max_new_tokens=2))
        OUTCOMES["loaded and ran"] += 1
    except ValueError as err:
        known = ("tokenizer.json failed on this text", "tokenizer.json has no token for", "tokens long")
        assert any(message in str(err) for message in known), err
        OUTCOMES["loaded, text refused"] += 1


def fuzz_config_fields(folder: Path) -> Counter[str]:
    """Write each family's config.json with one field changed to each of
    :data:`tests.fixtures.crafted.WRONG_VALUES`, read and build it.

    Returns:
        How many changes built and how many were refused.

    Raises:
        AssertionError: an error that is not a one-line CheckpointError naming config.json
            and the field (the family, field and value in the message); any other
            exception passes through.
    """
    outcomes: Counter[str] = Counter()
    path = folder / "config.json"
    for model_type, valid in FAMILY_CONFIGS.items():
        family = FAMILIES[model_type]
        family.build(family.read_config(valid, path=path))  # the unchanged file builds
        changes = [(field, value) for field in sorted(set(valid) - {"model_type"}) for value in WRONG_VALUES]
        if model_type in ("llama", "gemma3_text"):  # and the fields inside rope_parameters
            changes += [("rope_parameters", rope) for rope in _wrong_rope_parameters(model_type)]
        for field, value in changes:
            path.write_text(json.dumps(valid | {field: value}))
            case = f"{model_type} {field}={value!r}"
            try:
                family.build(family.read_config(read_config(folder), path=path))
            except models.CheckpointError as err:
                message = str(err)
                assert "\n" not in message and message.startswith(f"{path}"), f"{case}: {message}"
                assert err.field is not None, f"{case}: names no field: {message}"
                outcomes["refused"] += 1
            else:
                outcomes["built"] += 1
    return outcomes


def _wrong_rope_parameters(model_type: str) -> list[dict[str, Any]]:
    """``rope_parameters`` of every rotary type with one field of a wrong value (Gemma 3's
    keyed by layer type)."""
    fields = ("rope_type", "rope_theta", "factor", "low_freq_factor", "original_max_position_embeddings")
    out = []
    for rope_type in ("default", "linear", "llama3", "dynamic"):
        for field in fields:
            for value in WRONG_VALUES:
                params = {"rope_type": rope_type, field: value}
                keyed = {"sliding_attention": params, "full_attention": params}
                out.append(keyed if model_type == "gemma3_text" else params)
    return out


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        write_tiny_llama(base / "pristine")
        fuzz_load(base)
    print(f"fuzzed {EXAMPLES} checkpoints under a {MEMORY_LIMIT >> 30} GiB address-space limit: {dict(OUTCOMES)}")


if __name__ == "__main__":
    main()
