"""The shared ``config.json`` reader and tensor renaming: every family reads through
:class:`attnkit.models.checkpoints.config_reader.ConfigReader` (so each refusal is one line naming the
file, the field, what was expected and what was found) and renames through
:func:`attnkit.models.checkpoints.renaming.rename_tensors`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from attnkit import models
from attnkit.models.checkpoints.config_reader import CONFIG_LIMITS, ConfigReader
from attnkit.models.checkpoints.renaming import rename_tensors
from attnkit.models.families.table import FAMILIES
from tests.fixtures.crafted import FAMILY_CONFIGS
from tests.test_layering import module_files

# What a family module reads config.json and renames tensors with, besides the shared
# reader: the field readers of attnkit.models.checkpoints.config_reader, used directly, are its own parser.
_OWN_PARSING = {"config_int", "config_float", "config_bool", "token_ids"}


@pytest.mark.parametrize(
    ("model_type", "field", "value", "match"),
    [
        ("t5", "d_model", 2**16 + 1, "d_model must be an integer from 1 to 65536, got 65537"),
        ("t5", "d_ff", 0, "d_ff must be an integer from 1 to 262144, got 0"),
        ("t5", "pad_token_id", 16, "pad_token_id must be an integer from 0 to 15, got 16"),
        ("t5", "decoder_start_token_id", -1, "decoder_start_token_id must be an integer from 0 to 15, got -1"),
        ("t5", "layer_norm_epsilon", 2.0, "layer_norm_epsilon must be a number above 0.0 and at most 1.0, got 2.0"),
        ("t5", "scale_decoder_outputs", "yes", "scale_decoder_outputs must be true or false, got 'yes'"),
        (
            "t5",
            "feed_forward_proj",
            "gated-swish",
            r"feed_forward_proj='gated-swish' is not supported \(attnkit has 'relu', 'gelu', 'gelu_new'",
        ),
        ("bart", "decoder_start_token_id", 16, "decoder_start_token_id must be an integer from 0 to 15, got 16"),
        ("bart", "encoder_attention_heads", 3, "encoder_attention_heads: d_model=8 is not a multiple of 3 heads"),
        ("bart", "decoder_attention_heads", 5, "decoder_attention_heads: d_model=8 is not a multiple of 5 heads"),
        ("bart", "encoder_ffn_dim", 2**18 + 1, "encoder_ffn_dim must be an integer from 1 to 262144, got 262145"),
        ("bart", "normalize_before", True, "normalize_before: pre-norm BART variants are not supported"),
        ("bart", "add_final_layer_norm", True, "add_final_layer_norm: pre-norm BART variants are not supported"),
        ("bart", "activation_function", "swish", r"activation_function='swish' is not supported \(attnkit has 'gelu'"),
        ("bert", "num_attention_heads", 3, "num_attention_heads: hidden_size=8 is not a multiple of 3 heads"),
        ("bert", "hidden_act", "relu", r"hidden_act='relu' is not supported \(attnkit has 'gelu'\)"),
        (
            "bert",
            "position_embedding_type",
            "relative_key",
            r"position_embedding_type='relative_key' is not supported \(attnkit has 'absolute'\)",
        ),
        ("attnkit_transformer", "d_model", 7, r"d_model: must be even \(sinusoidal encoding\), got 7"),
        ("attnkit_transformer", "attention_heads", 3, "attention_heads: d_model=8 is not a multiple of 3 heads"),
        ("attnkit_transformer", "ffn_dim", 2**18 + 1, "ffn_dim must be an integer from 1 to 262144, got 262145"),
        ("attnkit_transformer", "eos_token_id", [16], r"eos_token_id must be token ids in \[0, 16\), got \[16\]"),
        ("gpt2", "activation_function", "swish", r"activation_function='swish' is not supported \(attnkit has"),
        # transformers 4's names of GPT-NeoX's rotary fields are named as the file names them.
        ("gpt_neox", "rotary_emb_base", -1, "rotary_emb_base must be a number above 1.0 and at most 1000000000000.0"),
        ("gpt_neox", "rotary_pct", 2.0, "rotary_pct must be a number above 0.0 and at most 1.0, got 2.0"),
    ],
)
def test_a_refused_field_is_one_line_naming_the_file_the_field_and_both_values(model_type, field, value, match):
    path = Path("/m/config.json")
    with pytest.raises(models.CheckpointError, match=match) as info:
        FAMILIES[model_type].read_config(FAMILY_CONFIGS[model_type] | {field: value}, path=path)
    message = str(info.value)
    assert info.value.path == path and info.value.field == field
    assert message.startswith(f"{path}: ") and "\n" not in message


@pytest.mark.parametrize("model_type", ["t5", "bart", "bert", "attnkit_transformer"])
def test_the_encoder_families_read_their_valid_config(model_type):
    config = FAMILIES[model_type].read_config(FAMILY_CONFIGS[model_type], path=Path("config.json"))
    assert config.vocab_size == 16 and config.num_heads == 2


def test_t5_and_bart_take_their_defaults_from_the_reader():
    defaulted = ("decoder_start_token_id", "num_decoder_layers", "scale_decoder_outputs")
    t5 = {k: v for k, v in FAMILY_CONFIGS["t5"].items() if k not in defaulted}
    read = FAMILIES["t5"].read_config(t5 | {"pad_token_id": 3, "num_layers": 3, "tie_word_embeddings": False})
    # The decoder starts with the padding id and is as deep as the encoder; an untied head is
    # not scaled unless scale_decoder_outputs says so.
    assert read.decoder_start_token_id == 3 and read.num_decoder_layers == 3 and not read.scale_decoder_outputs
    assert FAMILIES["t5"].read_config(t5).scale_decoder_outputs
    bart = {k: v for k, v in FAMILY_CONFIGS["bart"].items() if k != "decoder_start_token_id"}
    assert FAMILIES["bart"].read_config(bart).decoder_start_token_id == 2


def test_size_is_bounded_like_a_common_field_and_from_a_minimum():
    path = Path("config.json")
    read = ConfigReader({"d_model": CONFIG_LIMITS["hidden_size"] + 1, "pad": 0, "buckets": 3}, path)
    assert read.size("d_model") == CONFIG_LIMITS["hidden_size"] + 1  # no limit of its own
    with pytest.raises(models.CheckpointError, match="d_model must be an integer from 1 to 65536, got 65537"):
        read.size("d_model", like="hidden_size")
    assert read.size("pad", minimum=0) == 0 and read.token_id("pad", 16, 5) == 0
    assert read.token_id("absent", 16, 5) == 5
    with pytest.raises(models.CheckpointError, match="buckets must be an integer from 4 to 1024, got 3"):
        read.size("buckets", 32, minimum=4, like="num_attention_heads")


def test_a_field_is_read_under_its_older_name_where_the_file_has_only_that():
    path = Path("config.json")
    read = ConfigReader({"rotary_emb_base": 500.0, "rope_theta": None}, path, aliases={"rope_theta": "rotary_emb_base"})
    assert read.field("rope_theta") == "rotary_emb_base" and read.number("rope_theta", 1.0) == 500.0
    assert read.rope(head_dim=4)[0].theta == 500.0
    newer = ConfigReader({"rotary_emb_base": 500.0, "rope_theta": 7.0}, path, aliases={"rope_theta": "rotary_emb_base"})
    assert newer.field("rope_theta") == "rope_theta" and newer.rope(head_dim=4)[0].theta == 7.0
    neox = FAMILY_CONFIGS["gpt_neox"]
    assert FAMILIES["gpt_neox"].read_config(neox | {"rope_theta": 5e5}).ropes[0].theta == 5e5
    assert FAMILIES["gpt_neox"].read_config(neox).rotary_dim == 2  # rotary_pct 0.5 of 4


def test_no_family_module_parses_config_json_or_renames_by_hand():
    family_modules = {family.read_config.__module__ for family in FAMILIES.values()}
    files = module_files()
    for name in family_modules:
        tree = ast.parse(files[name].read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.name in _OWN_PARSING
        }
        helpers = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "size"}
        assert not imported and not helpers, f"{name} reads config.json by hand: {sorted(imported | helpers)}"


def test_rename_tensors_drops_renames_collects_the_unknown_and_shares():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))

    def rename(key: str, value: torch.Tensor) -> dict[str, torch.Tensor] | None:
        return {"embed": {"x.embed": value}, "fused": {"x.q": value[:1], "x.k": value[1:]}, "copy": {}}.get(key)

    state, unknown = rename_tensors(
        {"embed": a, "fused": b, "copy": c, "layers.0.mask": d, "stray": d},
        rename,
        dropped=re.compile(r"layers\.\d+\.mask"),
        shared={"x.head": "x.embed", "x.absent": "x.missing"},
    )
    assert set(state) == {"x.embed", "x.q", "x.k", "x.head"} and unknown == ["stray"]
    assert state["x.head"] is a and torch.equal(state["x.k"], b[1:])
