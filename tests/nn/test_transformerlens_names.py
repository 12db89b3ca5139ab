"""TransformerLens' get_act_name, as TL's docs give its examples, and the alias table."""

from __future__ import annotations

import pytest

from attnkit.nn.transformerlens_names import get_act_name, transformerlens_aliases


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("k", 6, "a"), "blocks.6.attn.hook_k"),
        (("pre", 2), "blocks.2.mlp.hook_pre"),
        (("embed",), "hook_embed"),
        (("normalized", 27, "ln2"), "blocks.27.ln2.hook_normalized"),
        (("k6",), "blocks.6.attn.hook_k"),
        (("scale4ln1",), "blocks.4.ln1.hook_scale"),
        (("pre5",), "blocks.5.mlp.hook_pre"),
        (("z", 3), "blocks.3.attn.hook_z"),
        (("attn", 3), "blocks.3.attn.hook_pattern"),
        (("resid_pre", 0), "blocks.0.hook_resid_pre"),
        (("scale",), "ln_final.hook_scale"),
        (("blocks.3.attn.hook_z",), "blocks.3.attn.hook_z"),
    ],
)
def test_get_act_name(args, expected):
    assert get_act_name(*args) == expected


def test_two_stacks_leave_ambiguous_names_out():
    names = ["encoder.layers.0.resid_pre", "decoder.layers.0.resid_pre", "decoder.layers.0.self_attn.z"]
    aliases = transformerlens_aliases(names)
    assert "blocks.0.hook_resid_pre" not in aliases
    assert aliases["blocks.0.attn.hook_z"].point == "decoder.layers.0.self_attn.z"
    assert aliases["blocks.0.attn.hook_z"].heads_second
