"""The plan of each mode of `attnkit inspect`, formed before anything runs: the layers, heads,
rows and formats it will compute and write, and the one estimate of every file it writes."""

from __future__ import annotations

import pytest

import attnkit.inspect.methods
from attnkit.cli import CommandError, build_parser
from attnkit.cli.common import Status
from attnkit.cli.inspect_plan import InspectOptions, plan_encoder_decoder, plan_long, plan_maps
from attnkit.viz.estimates import (
    estimate_encoder_decoder_html,
    estimate_long_html,
    estimate_long_table_json,
    estimate_long_top_npz,
    estimate_map_canvas,
    estimate_map_json,
    estimate_viewer_html,
)

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
    # The decoder's map: target tokens as rows and its inputs as columns, later ones masked.
    assert plan.estimates == {"the JSON of layer 0": estimate_map_json(s_tgt, 1, causal=True, key_tokens=s_tgt)}
    assert plan.said == ()
    paged = plan_encoder_decoder(args, _options(tmp_path, ["html"]), tiny_t5)
    assert paged.stack_layers("encoder") is True and paged.stack_layers("decoder") is True
    page = f"the viewer page of {tiny_t5.num_layers + 2 * tiny_t5.num_decoder_layers} maps × 1 head"
    assert paged.estimates == {
        page: estimate_encoder_decoder_html(
            s_src,
            s_tgt,
            encoder_layers=tiny_t5.num_layers,
            decoder_layers=tiny_t5.num_decoder_layers,
            heads={"encoder": 1, "decoder": 1, "cross": 1},
        )
    }
    assert paged.said == (page,)


def test_a_long_plan_estimates_every_file_from_the_labels_and_blocks(tmp_path, tiny_family_folder):
    from attnkit import models

    model = models.load(tiny_family_folder("gemma3_text"))
    text = " ".join(f"w{i % 40}" for i in range(300))
    args = _args("--long", text, "--max-tokens", "60", "--layers", "1", "--top", "2")
    plan = plan_long(args, _options(tmp_path, ["json", "png"]), model)
    assert plan.layers == [1] and plan.heads is None
    assert plan.ids.numel() == len(plan.labels) == 60 and plan.block == 1  # at most 256 blocks per side
    heads, chosen = model.num_heads, {1: list(range(model.num_heads))}
    table = f"the head table of {heads} heads (long_context.json)"
    top = f"the top keys of {heads} heads (long_context_top.npz)"
    assert plan.estimates == {
        table: estimate_long_table_json(chosen, tokens=60, block=1, model_name=model.name),
        top: estimate_long_top_npz(chosen, tokens=60, top_k=2),
        CANVAS: estimate_map_canvas(60, 1),  # each layer's reduced map, 60 blocks a side
    }
    assert plan.said == (table, top)  # the files of the whole run; not the pictures, one per layer
    paged = plan_long(args, _options(tmp_path, ["html"]), model)
    bound = estimate_long_html(paged.labels, heads, top_k=2, block=paged.block, model_name=model.name)
    page = f"the long view page of {heads} heads (long_context.html)"
    assert paged.estimates == {page: bound} and paged.said == (page,)


def test_long_reads_max_size_before_the_model_loads(capsys, tmp_path, monkeypatch):
    import attnkit.cli.inspect_long
    from attnkit.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before --max-size was read")

    monkeypatch.setattr(attnkit.cli.inspect_long, "load_model_of", no_loading)
    code = main(["inspect", "--long", "hello", "--max-size", "lots", "--format", "json", "--out", str(tmp_path)])
    assert code == 2 and capsys.readouterr().err.startswith("attnkit: error: --max-size")


# Each mode of `attnkit inspect` on a tiny random checkpoint, every format: (model, argv, formats).
WORDS = " ".join(f"w{i % 40}" for i in range(60))
SOURCE, TARGET = "the big dog ran to the red house", "a cat sat on the mat"
MODES = {
    "maps, two layers of two heads": ("gemma3_text", [WORDS, "--layers", "0,1", "--heads", "0,1"]),
    "maps, one head": ("gemma3_text", [WORDS, "--layers", "2"]),
    "long": ("gemma3_text", ["--long", WORDS, "--top", "5"]),
    "encoder-decoder, cross": ("t5", [SOURCE, "--decoder-text", TARGET, "--heads", "0,2"]),
    "encoder-decoder, generated decoder": ("t5", [SOURCE, "--max-new-tokens", "5", "--attention", "decoder"]),
    "encoder-decoder, BART's encoder": ("bart", [SOURCE, "--decoder-text", "a cat", "--attention", "encoder"]),
}
# How much larger than the file each estimate may be, and why: the JSON's and the head
# table's count every number at its longest text (measured 1.03 to 1.33); the viewer pages'
# are fits within 10% either side, not bounds (here 0.997 to 1.01: the page's script
# outweighs a tiny model's weights); the long page's and the top keys' count their arrays
# as if compression saved nothing (measured 2.1: the weights of random models compress to
# about half).
ALLOWED_RATIO = {"json": 1.5, "page": 1.1, "long_context.json": 1.5, "long_context_top.npz": 3, "long_context.html": 3}


@pytest.fixture(scope="module")
def tiny_checkpoints(tiny_family_folder, tiny_t5_path, tmp_path_factory):
    from tests.fixtures.encoder_decoder_checkpoints import write_bart

    # BART with stacks of different widths: 2 encoder heads, 8 decoder heads.
    bart = write_bart(tmp_path_factory.mktemp("bart") / "bart", encoder_attention_heads=2, decoder_attention_heads=8)
    return {"gemma3_text": tiny_family_folder("gemma3_text"), "t5": tiny_t5_path, "bart": bart}


def _plan_of(folder, argv, formats):
    from attnkit import models
    from attnkit.cli.inspect_plan import InspectOptions

    model = models.load(folder)
    args = _args(*argv)
    options = InspectOptions(list(formats), None, {}, folder, Status(quiet=True))
    planner = plan_long if args.long else plan_encoder_decoder if model.encoder_decoder else plan_maps
    return planner(args, options, model)


def _estimate_of(path, estimates):
    """The estimate that covers the file ``path`` and how much larger it may be."""
    from attnkit.cli.inspect_plan import PNG_CANVAS, SVG_FILE

    if path.name.startswith("long_context"):
        return next(size for name, size in estimates.items() if f"({path.name})" in name), ALLOWED_RATIO[path.name]
    if path.suffix == ".html":
        return next(size for name, size in estimates.items() if name.startswith("the viewer page")), ALLOWED_RATIO[
            "page"
        ]
    if path.suffix == ".json":
        layer = int(path.stem.split("_layer")[1].split("_")[0])
        return estimates[f"the JSON of layer {layer}"], ALLOWED_RATIO["json"]
    # A picture's estimate is of the canvas it is drawn on, not of its compressed file.
    return {".png": estimates[PNG_CANVAS], ".svg": estimates[SVG_FILE]}[path.suffix], None


@pytest.mark.parametrize("mode", MODES)
def test_every_file_written_is_within_its_estimate_said_before_anything_runs(capsys, tmp_path, tiny_checkpoints, mode):
    import struct

    from attnkit.cli import main
    from attnkit.cli.common import format_size

    case, argv = MODES[mode]
    formats = ["png", "svg", "json", "html"]
    plan = _plan_of(tiny_checkpoints[case], argv, formats)
    out = tmp_path / "out"
    code = main(
        ["inspect", *argv, "--model", str(tiny_checkpoints[case]), "--format", ",".join(formats), "--out", str(out)]
    )
    _, err = capsys.readouterr()
    assert code == 0, err
    files = sorted(out.iterdir())
    assert {path.suffix for path in files} >= {".png", ".svg", ".json", ".html"}
    for path in files:
        estimate, ratio = _estimate_of(path, plan.estimates)
        size = path.stat().st_size
        if path.name.endswith("_viewer.html"):  # a fit, within 10% either side
            assert abs(estimate - size) <= 0.10 * size, (path.name, size, estimate)
        else:  # a bound
            assert size <= estimate, (path.name, size, estimate)
        if ratio is not None:
            assert estimate <= ratio * size, (path.name, size, estimate)
        if path.suffix == ".png":  # the canvas, to the pixel: width × height × 4 bytes
            width, height = struct.unpack(">II", path.read_bytes()[16:24])
            assert estimate == 4 * width * height
    # The files of the whole run are said, one line each, before anything runs.
    lines = err.splitlines()
    first_run = next(i for i, line in enumerate(lines) if line.startswith(("attnkit: running", "attnkit: summarising")))
    assert plan.said and all(
        name.startswith(("the viewer page", "the long view page", "the head table", "the top keys"))
        for name in plan.said
    )
    for name in plan.said:
        line = f"attnkit: {name}: about {format_size(plan.estimates[name])}, estimated before computing"
        assert line in lines[:first_run], (line, lines)


# For each mode, a file and a flag the refusal's advice names to make it smaller.
REFUSED = {
    "maps, two layers of two heads": ("json", "the JSON of layer 0", "--rows"),
    "long": ("json", "the top keys of 12 heads (long_context_top.npz)", "--top"),
    "encoder-decoder, cross": ("png", "the canvas of each PNG", "--dpi"),
    "encoder-decoder, generated decoder": ("html", "the viewer page of 8 maps", "--max-new-tokens"),
}


@pytest.mark.parametrize("mode", REFUSED)
def test_a_file_over_max_size_is_refused_before_the_model_runs(capsys, tmp_path, tiny_checkpoints, monkeypatch, mode):
    import attnkit.cli.inspect_encoder_decoder
    import attnkit.cli.inspect_long
    import attnkit.cli.inspect_maps
    from attnkit.cli import main

    def no_running(*args, **kwargs):
        raise AssertionError("the model ran")

    for module, name in (
        (attnkit.cli.inspect_maps, "_compute_maps"),
        (attnkit.cli.inspect_long, "_run"),
        (attnkit.cli.inspect_encoder_decoder, "_run"),
    ):
        monkeypatch.setattr(module, name, no_running)
    case, argv = MODES[mode]
    fmt, refused, flag = REFUSED[mode]
    estimates = _plan_of(tiny_checkpoints[case], argv, [fmt]).estimates
    size = next(size for name, size in estimates.items() if name.startswith(refused))
    out = tmp_path / "out"
    argv = [*argv, "--model", str(tiny_checkpoints[case]), "--format", fmt, "--max-size", str(size - 1)]
    code = main(["inspect", *argv, "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and f"{refused}" in err and "so nothing was written" in err and flag in err, err
    assert not out.exists() or not list(out.iterdir())
