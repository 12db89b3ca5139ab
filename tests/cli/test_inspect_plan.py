"""The plan of each mode of `attnkit inspect`, formed before anything runs: the layers, heads,
rows and formats it will compute and write, and the one estimate of every file it writes."""

from __future__ import annotations

import pytest

import attnkit.inspect.methods
from attnkit.cli import CommandError, build_parser
from attnkit.cli.common import Status
from attnkit.cli.inspect_plan import InspectOptions, plan_encoder_decoder, plan_long, plan_maps
from attnkit.viz.estimates import estimate_map_canvas, estimate_map_json, estimate_viewer_html

CANVAS = "the canvas of each PNG (pixels × 4 bytes, drawn before compression)"


def _args(*argv: str):
    return build_parser().parse_args(["inspect", *argv])


def _options(tmp_path, formats, *, limit=None, page_modes=()):
    return InspectOptions(list(formats), limit, {}, tmp_path, Status(quiet=True), list(page_modes))


def test_a_plan_of_maps_estimates_every_file_it_will_write_and_runs_nothing(tmp_path, monkeypatch, minilm):
    def no_running(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(attnkit.inspect.methods, "method_map", no_running)
    text = "The cat sat on the mat."
    args = _args(text, "--layers", "2,-1", "--heads", "0,3", "--method", "rollout")
    plan = plan_maps(args, _options(tmp_path, ["png", "json", "html"], page_modes=["rollout"]), minilm)
    tokens = len(minilm.tokenize(text).tokens)
    assert (plan.text, plan.tokens, plan.layers, plan.heads, plan.rows) == (text, tokens, [2, 5], [0, 3], None)
    assert plan.page is not None and plan.page.name == "the viewer page of 2 layers × 2 heads"
    assert (plan.page.layers, plan.page.heads, plan.page.modes) == ([2, 5], [0, 3], ["rollout"])
    assert plan.estimates == {
        "the JSON of layer 2": estimate_map_json(tokens, 2, causal=False),
        "the JSON of layer 5": estimate_map_json(tokens, 2, causal=False),
        CANVAS: estimate_map_canvas(tokens, 2),
        # A rollout colour mode adds one map per layer.
        plan.page.name: estimate_viewer_html(tokens, 2, 2 + 1, causal=False),
    }
    assert plan.said == (plan.page.name,)


def test_a_plan_of_some_rows_estimates_those_rows_and_says_nothing_without_a_page(tmp_path, minilm):
    plan = plan_maps(_args("one two three four five six", "--rows=-2:"), _options(tmp_path, ["json"]), minilm)
    assert plan.rows == range(plan.tokens - 2, plan.tokens) and plan.page is None and plan.said == ()
    assert plan.estimates == {"the JSON of layer 5": estimate_map_json(plan.tokens, 1, causal=False, rows=2)}


def test_a_plan_over_the_limit_is_refused_before_anything_runs(tmp_path, minilm):
    with pytest.raises(CommandError, match="the JSON of layer 5 would be about"):
        plan_maps(_args("The cat sat on the mat."), _options(tmp_path, ["json"], limit=100), minilm)


def test_an_encoder_decoder_plan_keeps_the_layers_of_its_maps_or_all_for_the_page(tmp_path, tiny_t5):
    source, target = "the big dog ran", "a cat sat"
    args = _args(source, "--decoder-text", target, "--attention", "decoder", "--layers", "0", "--heads", "1")
    plan = plan_encoder_decoder(args, _options(tmp_path, ["json"]), tiny_t5)
    s_src, s_tgt = len(tiny_t5.tokenize(source)), len(tiny_t5.tokenize(target))
    assert (plan.kind, plan.source_tokens, plan.target_tokens, plan.layers) == ("decoder", s_src, s_tgt, [0])
    assert (plan.heads, plan.map_heads, plan.stack_layers("encoder"), plan.stack_layers("decoder")) == (
        [1],
        [1],
        [],
        [0],
    )
    assert plan.estimates == {"the JSON of layer 0": estimate_map_json(max(s_src, s_tgt), 1, causal=False)}
    paged = plan_encoder_decoder(args, _options(tmp_path, ["html"]), tiny_t5)
    assert paged.stack_layers("encoder") is True and paged.stack_layers("decoder") is True
    assert list(paged.estimates) == [
        f"the viewer page of {tiny_t5.num_layers + 2 * tiny_t5.num_decoder_layers} maps × 1 head"
    ]


def test_a_long_plan_estimates_its_page_from_the_labels_and_blocks(tmp_path, tiny_family_folder):
    from attnkit import models
    from attnkit.viz.viewer.long_view import estimate_long_html

    model = models.load(tiny_family_folder("gemma3_text"))
    text = " ".join(f"w{i % 40}" for i in range(300))
    args = _args("--long", text, "--max-tokens", "60", "--layers", "1", "--top", "2")
    plan = plan_long(args, _options(tmp_path, ["json"]), model)
    assert plan.layers == [1] and plan.heads is None and plan.estimates == {} and plan.said == ()
    assert plan.ids.numel() == len(plan.labels) == 60 and plan.block == 1  # at most 256 blocks per side
    paged = plan_long(args, _options(tmp_path, ["html"]), model)
    heads = model.num_heads
    bound = estimate_long_html(paged.labels, heads, top_k=2, block=paged.block, model_name=model.name)
    assert paged.estimates == {f"the long view page of {heads} heads (long_context.html)": bound}


def test_long_reads_max_size_before_the_model_loads(capsys, tmp_path, monkeypatch):
    import attnkit.cli.inspect_long
    from attnkit.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before --max-size was read")

    monkeypatch.setattr(attnkit.cli.inspect_long, "load_model_of", no_loading)
    code = main(["inspect", "--long", "hello", "--max-size", "lots", "--format", "json", "--out", str(tmp_path)])
    assert code == 2 and capsys.readouterr().err.startswith("attnkit: error: --max-size")
