"""Crafted checkpoint folders: every one is refused before anything is built, with a
:class:`attnkit.models.CheckpointError` that names the file and the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnkit import models
from attnkit.models.checkpoints.tokenizer import Tokenizer
from attnkit.models.families.table import FAMILIES
from tests.fixtures.crafted import (
    FAMILY_CONFIGS,
    TINY_LLAMA_CONFIG,
    read_header,
    tiny_llama_tensors,
    tokenizer_json,
    write_tiny_llama,
    write_with_header,
)
from tests.models.checkpoints.fuzz_load import fuzz_config_fields

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_llama(tmp_path / "tiny")


def _config(folder: Path, **changes) -> None:
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA_CONFIG, **changes}))


def _refused(folder: Path, file: str, field: str | None, match: str) -> models.CheckpointError:
    with pytest.raises(models.CheckpointError, match=match) as info:
        models.load(folder)
    assert info.value.path == folder / file and info.value.field == field
    assert str(info.value).startswith(str(folder / file))
    return info.value


def test_the_tiny_checkpoint_loads(tiny):
    run = models.load(tiny).run("the cat sat")
    assert run.tokens == ["the", "cat", "sat"] and list(run.logits.shape) == [1, 3, 16]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("num_hidden_layers", 1_000_000_000, "num_hidden_layers must be an integer from 1 to 1024, got 1000000000"),
        ("num_hidden_layers", 3, "num_hidden_layers is 3, but the weights hold 2 layers"),
        ("vocab_size", 1e12, r"vocab_size must be an integer from 1 to 2097152, got 1000000000000.0"),
        ("max_position_embeddings", 1_000_000_000, "max_position_embeddings must be an integer from 1 to 131072"),
        ("num_attention_heads", 0, "num_attention_heads must be an integer from 1 to 1024, got 0"),
        ("num_attention_heads", 3, "hidden_size=8 is not a multiple of 3 heads"),
        ("num_key_value_heads", 5, "num_key_value_heads must be an integer from 1 to 2, got 5"),
        ("hidden_size", float("inf"), "hidden_size must be an integer from 1 to 65536, got inf"),
        ("intermediate_size", "16", "intermediate_size must be an integer from 1 to 262144, got '16'"),
        ("intermediate_size", True, "intermediate_size must be an integer"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps must be a number above 0.0 and at most 1.0, got nan"),
        ("rope_theta", -1, "rope_theta must be a number above 1.0"),
        ("rope_scaling", [1, 2], r"rope_scaling: must be an object, got \[1, 2\]"),
        ("eos_token_id", 10**30, r"eos_token_id must be token ids in \[0, 16\)"),
        ("eos_token_id", ["x"], r"eos_token_id must be token ids"),
        ("hidden_act", {"a": [1]}, "hidden_act={'a': \\[1\\]} is not supported"),
        ("model_type", ["llama"], r"model_type \['llama'\] is not supported"),
    ],
)
def test_crafted_config_fields_are_refused_by_name(tiny, field, value, match):
    _config(tiny, **{field: value})
    start = time.perf_counter()
    _refused(tiny, "config.json", field, match)
    assert time.perf_counter() - start < 10  # nothing was built: a billion layers used to run until killed


def test_weights_that_do_not_fit_are_refused_before_building(tiny):
    _config(tiny, intermediate_size=2**17)
    _refused(
        tiny,
        "model.safetensors",
        "model.layers.0.mlp.up_proj.weight",
        r"wrong shape for config.json's sizes: \[model.layers.0.mlp.up_proj.weight is \[16, 8\], expected "
        r"\[131072, 8\]",
    )


def test_malformed_json_is_refused(tiny):
    (tiny / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(tiny, "config.json", None, "is not valid JSON")
    (tiny / "config.json").write_text('{"model_type": "llama", "model_type": "bert"}')
    _refused(tiny, "config.json", None, "key 'model_type' appears twice")


@pytest.mark.parametrize(
    ("change", "field", "match"),
    [
        (lambda h: h["model.norm.weight"].update(shape=[-1, -8]), "model.norm.weight", "bad header entry"),
        (lambda h: h["model.norm.weight"].update(shape=[True] * 8), "model.norm.weight", "bad header entry"),
        (
            lambda h: h.update(empty={"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}),
            "empty",
            "bad header entry",
        ),
        (lambda h: h["model.norm.weight"].update(dtype="F8_E9"), "model.norm.weight", "dtype 'F8_E9'"),
        (lambda h: h["model.norm.weight"].update(data_offsets=[1.5, 2]), "model.norm.weight", "bad header entry"),
        (lambda h: h.update(__metadata__={"format": 1}), "__metadata__", "__metadata__ must map names to strings"),
        (lambda h: h.update(__metadata__=[1]), "__metadata__", "__metadata__ must map names to strings"),
    ],
)
def test_crafted_safetensors_headers_are_refused(tiny, change, field, match):
    header, data = read_header(tiny / "model.safetensors")
    change(header)
    write_with_header(tiny / "model.safetensors", header, data)
    _refused(tiny, "model.safetensors", field, match)


def test_crafted_safetensors_header_bytes_are_refused(tiny):
    header, data = read_header(tiny / "model.safetensors")
    nested = b"[" * 50_000 + b"]" * 50_000
    write_with_header(tiny / "model.safetensors", None, data, header_text=nested)
    _refused(tiny, "model.safetensors", None, "nested too deeply|not a JSON object")
    text = json.dumps(header).encode()
    repeated = text[:-1] + b', "model.norm.weight": ' + json.dumps(header["model.norm.weight"]).encode() + b"}"
    write_with_header(tiny / "model.safetensors", None, data, header_text=repeated)
    _refused(tiny, "model.safetensors", None, "key 'model.norm.weight' appears twice")


def test_integer_weights_are_refused(tiny):
    from safetensors.torch import save_file

    from tests.fixtures.crafted import tiny_llama_tensors

    tensors = tiny_llama_tensors()
    tensors["model.norm.weight"] = tensors["model.norm.weight"].long()
    save_file(tensors, str(tiny / "model.safetensors"))
    _refused(tiny, "model.safetensors", "model.norm.weight", "weights must be floating point")


def test_a_tokenizer_with_ids_beyond_the_embedding_is_refused(tiny):
    words = [f"w{i}" for i in range(40)]
    (tiny / "tokenizer.json").write_text(json.dumps(tokenizer_json(words + ["[UNK]"])))
    _refused(tiny, "tokenizer.json", "vocab_size", "has token id 40, but the model's embedding has vocab_size=16")


def test_a_tokenizer_with_few_ids_but_one_beyond_the_embedding_is_refused(tiny):
    # Three words, so the count fits the 16 rows; the largest id does not.
    spec = tokenizer_json(["the", "cat", "[UNK]"])
    spec["model"]["vocab"]["w5"] = 100000
    (tiny / "tokenizer.json").write_text(json.dumps(spec))
    _refused(tiny, "tokenizer.json", "vocab_size", "has token id 100000, but the model's embedding has vocab_size=16")


@pytest.mark.parametrize(
    "file", ["config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json"]
)
def test_a_huge_sparse_file_is_refused_before_it_is_read(tiny, file):
    if file == "model.safetensors.index.json":
        (tiny / "model.safetensors").rename(tiny / "model-00001.safetensors")
    with open(tiny / file, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GB that take no disk
    with pytest.raises(models.CheckpointError, match=r"is 3221225472 bytes, more than the \d+ attnkit reads") as info:
        models.load(tiny)
    assert info.value.path == tiny / file


def test_a_weights_file_linked_to_process_memory_is_refused(tiny):
    (tiny / "model.safetensors").unlink()
    (tiny / "model.safetensors").symlink_to("/proc/self/mem")
    _refused(tiny, "model.safetensors", None, "is not a safetensors file: it is only 0 bytes")


def test_a_broken_tokenizer_is_refused(tiny):
    (tiny / "tokenizer.json").write_text('{"model": 3}')
    _refused(tiny, "tokenizer.json", None, "is not a valid tokenizer file")


def test_words_outside_a_word_level_vocabulary_are_named(tmp_path):
    # A word-level tokenizer with no unknown token refuses a text over its unknown words,
    # naming none ("Missing [UNK] token"): attnkit names them and the vocabulary.
    from tokenizers import Tokenizer as Backend
    from tokenizers import models as backends
    from tokenizers import pre_tokenizers

    backend = Backend(backends.WordLevel({f"w{i}": i for i in range(50)}))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    tokenizer = Tokenizer.from_file(path)
    assert tokenizer.encode("w3 w49").tokens == ["w3", "w49"]
    first = ", ".join(f"'w{i}'" for i in range(40))
    with pytest.raises(ValueError, match=rf"has no token for 'w50', 'x'; its vocabulary is {first} and 10 more$"):
        tokenizer.encode("w1 w50 x w50")


def test_a_catastrophic_tokenizer_pattern_is_a_clear_error(tiny):
    spec = tokenizer_json()
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    (tiny / "tokenizer.json").write_text(json.dumps(spec))
    model = models.load(tiny)
    with pytest.raises(ValueError, match=r"tokenizer.json failed on this text: .*retry-limit"):
        model.run("a" * 40 + "b")


def test_text_that_is_not_unicode_is_a_clear_error(tiny):
    model = models.load(tiny)
    with pytest.raises(ValueError, match=r"not valid Unicode: '\\ud800' at character 2 is a lone surrogate"):
        model.run("a \ud800 b")


@pytest.mark.slow
def test_fuzzed_checkpoints_give_a_clear_error_or_load_under_a_memory_limit():
    """Hypothesis drives config.json fields, safetensors headers and tokenizer files through
    ``models.load`` in a subprocess limited to 3 GiB of address space (a model of these
    sizes needs about 1): every case loads and runs, or raises a CheckpointError naming the
    file. Never a hang, a raw exception or an allocation past the limit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.models.checkpoints.fuzz_load"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "fuzzed" in done.stdout


@pytest.mark.slow
def test_every_config_field_of_every_family_with_a_wrong_type_is_one_line_naming_it(tmp_path):
    # About 4,000 config.json files (13 families, every field, 15 values; rope_parameters
    # inside too): ~10 s of CPU.
    outcomes = fuzz_config_fields(tmp_path)
    assert outcomes["refused"] > 1000 and outcomes["built"] > 0, outcomes


@pytest.mark.parametrize(
    ("model_type", "field", "value", "match"),
    [
        ("llama", "layer_types", [["full_attention"]] * 2, r"layer_types: \['full_attention'\] is not supported"),
        ("t5", "feed_forward_proj", ["relu"], r"feed_forward_proj=\['relu'\] is not supported"),
        ("bart", "activation_function", ["gelu"], r"activation_function=\['gelu'\] is not supported"),
        ("gpt_neox", "attention_bias", "false", "attention_bias must be true or false, got 'false'"),
        ("gemma2", "attn_logit_softcapping", 1e-300, "attn_logit_softcapping must be 0 or at least 1.18e-38"),
        ("gemma2", "query_pre_attn_scalar", 1e-300, "query_pre_attn_scalar must be 0 or at least 1.18e-38"),
        ("t5", "relative_attention_num_buckets", 1, "relative_attention_num_buckets must be an integer from 4"),
        ("t5", "relative_attention_max_distance", 4, "relative_attention_max_distance must be an integer from 5"),
        (
            "gemma3_text",
            "rope_parameters",
            {"sliding_attention": 3, "full_attention": {"rope_theta": 1e6}},
            r"rope_parameters.sliding_attention: must be an object, got 3",
        ),
    ],
)
def test_a_config_field_of_the_wrong_type_or_size_is_named(tmp_path, model_type, field, value, match):
    config = {k: v for k, v in FAMILY_CONFIGS[model_type].items() if k != "rope_local_base_freq"}
    path = tmp_path / "config.json"
    with pytest.raises(models.CheckpointError, match=match) as info:
        FAMILIES[model_type].read_config(config | {field: value}, path=path)
    assert info.value.path == path and info.value.field is not None and info.value.field.startswith(field)


def test_a_weight_that_is_not_finite_is_refused_by_name(tiny):
    tensors = tiny_llama_tensors()
    tensors["model.layers.1.mlp.up_proj.weight"][3, 2] = float("nan")
    tensors["model.layers.1.mlp.up_proj.weight"][0, 0] = float("inf")
    save_file(tensors, str(tiny / "model.safetensors"))
    _refused(
        tiny,
        "model.safetensors",
        "model.layers.1.mlp.up_proj.weight",
        "tensor 'model.layers.1.mlp.up_proj.weight' has 2 values that are NaN or infinite in float32",
    )


def test_a_weight_finite_in_float32_but_not_in_float16_is_refused(tiny):
    tensors = tiny_llama_tensors()
    tensors["model.norm.weight"][0] = 1e6
    save_file(tensors, str(tiny / "model.safetensors"))
    with pytest.raises(
        models.CheckpointError, match="'model.norm.weight' has 1 values that are NaN or infinite in float16"
    ):
        models.load(tiny, dtype=torch.float16)


def test_a_bias_switched_off_in_config_json_is_one_line_naming_the_tensors(tiny_family_folder, tmp_path):
    folder = tmp_path / "neox"
    shutil.copytree(tiny_family_folder("gpt_neox"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"attention_bias": False}))
    with pytest.raises(models.CheckpointError, match=r"unexpected \[decoder.layers.0.self_attn.k_proj.bias") as info:
        models.load(folder)
    assert "\n" not in str(info.value)


# Hardening: what a load counts and checks before it builds or reads anything.


def _with_template_id(folder: Path, token_id: int) -> None:
    """Give the tokenizer a post-processor that adds ``<s>`` with id ``token_id`` in front."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [token_id], "tokens": ["<s>"]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))


def test_a_post_processor_id_beyond_the_embedding_is_refused_at_load(tiny):
    _with_template_id(tiny, 999_999)
    _refused(tiny, "tokenizer.json", "vocab_size", "has token id 999999, but the model's embedding has vocab_size=16")


def test_tokenize_checks_its_ids_against_the_embedding(tiny):
    model = models.load(tiny)
    _with_template_id(tiny, 999_999)
    model.tokenizer = Tokenizer.from_file(tiny / "tokenizer.json")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 16\), got \[1, 999999\]"):
        model.tokenize("the cat")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 16\)"):
        model.run("the cat")


def test_the_post_processor_ids_of_bert_and_sequences_count_too():
    from attnkit.models.checkpoints.tokenizer import _post_processor_ids

    bert = {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}
    template = {"type": "TemplateProcessing", "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]}}}
    assert sorted(_post_processor_ids(bert)) == [101, 102]
    assert sorted(_post_processor_ids({"type": "Sequence", "processors": [bert, template]})) == [7, 101, 102]
    assert _post_processor_ids(None) == []


def test_the_load_estimate_counts_the_rotary_tables(tmp_path, monkeypatch):
    # Weights of 4 MiB whose rotary tables (2 x 8,192 positions x head dim 512 x 4 bytes) take
    # 32 MiB once built.
    config = {**TINY_LLAMA_CONFIG, "hidden_size": 512, "num_attention_heads": 1, "num_key_value_heads": 1}
    config |= {"num_hidden_layers": 1, "max_position_embeddings": 8192}
    folder = write_tiny_llama(tmp_path / "wide")
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tiny_llama_tensors(config), str(folder / "model.safetensors"))
    monkeypatch.setenv("ATTNKIT_MEMORY_LIMIT", "20MB")
    with pytest.raises(models.MemoryEstimateError, match=r"and its position tables would take about 36 MiB,"):
        models.load(folder)
    monkeypatch.setenv("ATTNKIT_MEMORY_LIMIT", "60MB")
    model = models.load(folder)
    from attnkit.models.families.meta_device import buffer_bytes

    assert buffer_bytes(model.module) == 0  # built: nothing left on meta
    built = sum(b.numel() * b.element_size() for b in model.module.buffers())
    assert 32 * 2**20 <= built <= 32 * 2**20 + 8192


def _sharded(folder: Path) -> dict[str, str]:
    """Split the tiny checkpoint into two shards with an index; the index's weight map."""
    tensors = tiny_llama_tensors()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    (folder / "model.safetensors").unlink()
    for shard, held in halves.items():
        save_file({name: tensors[name] for name in held}, str(folder / shard))
    weight_map = {name: shard for shard, held in halves.items() for name in held}
    _write_index(folder, weight_map)
    return weight_map


def _write_index(folder: Path, weight_map: dict[str, str]) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_a_sharded_checkpoint_with_a_true_index_loads(tiny):
    _sharded(tiny)
    assert models.load(tiny).run("the cat sat").tokens == ["the", "cat", "sat"]


def test_a_weight_map_that_puts_a_tensor_in_the_wrong_shard_is_refused(tiny):
    weight_map = _sharded(tiny)
    name = "model.norm.weight"
    weight_map[name] = next(shard for shard in set(weight_map.values()) if shard != weight_map[name])
    _write_index(tiny, weight_map)
    _refused(tiny, "model.safetensors.index.json", name, f"weight_map puts '{name}' in {weight_map[name]}, but")


def test_a_weight_map_that_lists_a_missing_tensor_or_leaves_one_out_is_refused(tiny):
    weight_map = _sharded(tiny)
    _write_index(tiny, {**weight_map, "model.ghost.weight": "model-00001-of-00002.safetensors"})
    _refused(tiny, "model.safetensors.index.json", "model.ghost.weight", "which no shard holds")
    left_out = sorted(weight_map)[0]
    _write_index(tiny, {k: v for k, v in weight_map.items() if k != left_out})
    _refused(tiny, "model.safetensors.index.json", left_out, f"weight_map does not list '{left_out}'")


def test_an_index_naming_a_shard_too_long_to_open_is_refused_naming_the_index(tiny):
    weight_map = _sharded(tiny)
    _write_index(tiny, {name: "m" * 5000 + ".safetensors" for name in weight_map})
    error = _refused(tiny, "model.safetensors.index.json", "weight_map", "shard names must be plain file names")
    assert len(str(error)) < 600


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float64, "float64", torch.int8])
def test_a_dtype_attnkit_does_not_compute_in_is_refused_before_anything_is_read(tiny, dtype, monkeypatch):
    from attnkit.models import loading

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the dtype was checked")

    monkeypatch.setattr(loading, "locate", never)
    with pytest.raises(TypeError, match=r"dtype must be 'auto', 'float32', 'bfloat16', 'float16' or one of those"):
        models.load(tiny, dtype=dtype)
