"""Analysis on SmolLM2: what hooks cost, what head ablation costs against one inspect, and
what activation patching by position costs against one run.

- ``Model.run`` without hooks against the fused forward pass called directly (the family's
  ``last_hidden_state`` and ``logits``, no hook point active): at most 1.02×. A run with a
  reading hook on every point but the weights, and ``run_with_cache`` of every name (the
  weights, per-head results and norm scales included) against a plain run: at most 1.5×.
- ``generate_ids`` of 16 tokens with one hook (on a middle layer's ``resid_post``) against
  the same generation without: at most 1.2×.
- ``attnkit heads TEXT --ablate --target TOKEN`` (all 30 × 9 heads) against one
  ``attnkit inspect TEXT`` on the same 16-token text, both as fresh processes (what a user
  waits for: imports, load, run, picture and JSON), and the library calls alone in this
  process (:func:`attnkit.inspect.interventions.head_ablation` against
  :func:`attnkit.inspect.attention_map`).
- :func:`attnkit.inspect.interventions.activation_patching` of ``resid_pre`` on the
  14-token IOI texts, by layer and position over all 30 layers and by position (every
  layer at once), against one plain ``Model.run`` of the clean text.
- ``run_with_cache`` of every name against a plain ``Model.run`` at 14 and 1,024 tokens
  (one thread, interleaved, paired ratios): at most 1.3×; beside it, the same cache with
  every entry read (the scores, patterns and per-head results it computes on first read). Where ``transformer-lens`` is
  installed (never in the project's environment: it pins its own dependencies), its
  ``run_with_cache`` (``HookedTransformer`` before TransformerLens 4, ``TransformerBridge`` from
  4 on) on the same weights is timed beside it; otherwise
  that column is left out.
- :func:`attnkit.inspect.patching_grids.attribution_patching` of every head of every layer
  (``z`` by head) and of every grid of ``EVERY`` at once, on an IOI pair of 100 tokens,
  against one plain ``Model.run`` of the clean text; beside it
  :func:`~attnkit.inspect.patching_grids.every_block_patching` of ``resid_pre``, ``attn_out``
  and ``mlp_out`` on the 14-token IOI pair, and TransformerLens'
  ``patching.get_act_patch_block_every`` on the same weights where it is installed.

Contenders are interleaved (:func:`benchmarks.common.interleaved_times`): the runs at one
thread, the ablation and inspect at torch's thread count, the patching at one thread. Run alone: ``python benchmarks/bench_analysis.py`` (``REPEAT=N`` for more rounds;
``--only hooks`` skips the ablation, the patching and the commands; ``--only patching``
prints the patching rows alone; ``--only attribution`` prints the attribution patching and
every-block rows alone; ``--only cache`` measures the full cache alone and writes it
into the analysis results already there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--only",
        choices=["hooks", "patching", "attribution", "cache"],
        help=(
            "hooks: the hook figures only; patching, attribution: those rows only (printed, not saved); cache: "
            "run_with_cache against run and TransformerLens at 14 and 1,024 tokens, written into the analysis "
            "results already there"
        ),
    )
    return parser


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import torch  # noqa: E402

from benchmarks.common import interleaved_times, markdown_table, matmul_gflops, write_results  # noqa: E402

TEXT = "The animal didn't cross the street because it was too tired, so the animal"  # 16 tokens
TARGET = " stayed"
ABLATION_TARGET_RATIO = 3.0
# The targets of the hook figures (ratios to the fused path in the same run).
RUN_TARGET_RATIO = 1.02
GENERATE_TARGET_RATIO = 1.2
CACHE_TARGET_RATIO = 1.5
GENERATED_TOKENS = 16
# A full cache against a plain run, at a short and a long text.
CACHE_LENGTHS = (14, 1024)
FULL_CACHE_TARGET_RATIO = 1.3
# TransformerLens' run_with_cache over attnkit's: at least this.
LENS_TARGET_RATIO = 1.2
FULL_CACHE_KEY = "full_cache"
# Activation patching: an IOI pair that differs in one name, and the logit difference of the names.
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
PATCH_TARGET, PATCH_WRONG = " Mary", " John"
# Attribution patching: the IOI pair after a neutral story, this many tokens in all.
ATTRIBUTION_TOKENS = 100
STORY = (
    "It was a warm afternoon and the town was busy with people walking along the river, looking at boats, "
    "talking about the market, the weather, the harvest and the long summer that had just begun there. Children "
    "ran between the stalls, an old man sold apples from a cart, and a dog slept in the shade of a wall while "
    "the bells of the church rang for the hour and the shopkeepers opened their doors to the evening air"
).split()


def _process_times(commands: dict[str, list[str]], repeat: int) -> dict[str, float]:
    """Median wall times of fresh processes, interleaved round by round."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands.items())
    for round_ in range(repeat + 1):
        for name, argv in order if round_ % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            if round_ > 0:  # the first round warms the page cache
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    from attnkit import models
    from attnkit.inspect import attention_map
    from attnkit.inspect.interventions import activation_patching, head_ablation

    repeat = int(os.environ.get("REPEAT", "3"))
    models.fetch("smollm2", progress=False)
    model = models.load("smollm2")
    tokens = len(model.tokenize(TEXT).tokens)
    assert tokens == 16, f"the benchmark text should be 16 tokens, got {tokens}"
    ids = model.tokenize(TEXT).ids
    mm = matmul_gflops()

    if args.only == "cache":
        cache_data, cache_markdown = full_cache(model, repeat)
        print(cache_markdown)
        write_full_cache(cache_data, cache_markdown, update_docs=args.update_docs)
        return

    if args.only == "attribution":
        print(markdown_table(["what", "time", "ratio"], attribution_figures(model, repeat)[1]))  # printed only
        return

    def before() -> None:
        with torch.no_grad():
            hidden = model.module.last_hidden_state(ids, return_weights=[]).output
            model.module.logits(hidden)

    reading = {
        name: (lambda t: None) for name in model.hook_names() if not name.endswith(("pattern", "scores", "result"))
    }
    steer = {f"decoder.layers.{model.num_layers // 2}.resid_post": lambda t: None}

    def through_hook_points() -> None:
        with model.hooks(reading):
            model.run(ids, return_weights=False)

    def generate(hooks: dict) -> None:
        with model.hooks(hooks):
            tokens = list(model.generate_ids(ids, max_new_tokens=GENERATED_TOKENS))
        assert len(tokens) == GENERATED_TOKENS, "the benchmark generation should not stop early"

    # One thread for the comparison of runs: on a shared machine, multi-threaded regions
    # wait for descheduled threads and scatter the times of these short calls.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = interleaved_times(
            {
                "run": lambda: model.run(ids, return_weights=False),
                "before": before,
                "reading_hooks": through_hook_points,
                "run_with_cache_all": lambda: model.run_with_cache(ids),
            },
            repeat=max(15, repeat),
        )
        generation = interleaved_times(
            {"plain": lambda: generate({}), "one_hook": lambda: generate(steer)}, repeat=repeat
        )
    finally:
        torch.set_num_threads(threads)
    hooks = {
        "run_seconds": runs,
        "run_ratio_vs_fused": runs["run"] / runs["before"],
        "reading_hooks_ratio_vs_run": runs["reading_hooks"] / runs["run"],
        "run_with_cache_ratio_vs_run": runs["run_with_cache_all"] / runs["run"],
        "generate_seconds": generation,
        "generate_one_hook_ratio": generation["one_hook"] / generation["plain"],
        "targets": {"run": RUN_TARGET_RATIO, "generate": GENERATE_TARGET_RATIO, "cache": CACHE_TARGET_RATIO},
    }
    rows = [
        [
            "`run` without hooks / the fused path called directly",
            f"{runs['run'] * 1e3:.1f} ms / {runs['before'] * 1e3:.1f} ms",
            f"{hooks['run_ratio_vs_fused']:.3f} (≤ {RUN_TARGET_RATIO})",
        ],
        [
            "`run` with a reading hook on every point but the weights / `run`",
            f"{runs['reading_hooks'] * 1e3:.1f} ms",
            f"{hooks['reading_hooks_ratio_vs_run']:.3f}",
        ],
        [
            f"`run_with_cache` of all {len(model.hook_names())} names / `run`",
            f"{runs['run_with_cache_all'] * 1e3:.1f} ms",
            f"{hooks['run_with_cache_ratio_vs_run']:.3f} (≤ {CACHE_TARGET_RATIO})",
        ],
        [
            f"`generate_ids` of {GENERATED_TOKENS} tokens, one hook / none",
            f"{generation['one_hook']:.2f} s / {generation['plain']:.2f} s",
            f"{hooks['generate_one_hook_ratio']:.3f} (≤ {GENERATE_TARGET_RATIO})",
        ],
    ]
    if args.only == "hooks":
        print(markdown_table(["what", "time", "ratio"], rows))  # printed only: the report needs every row
        return

    def patch(by: str) -> None:
        activation_patching(model, CLEAN, CORRUPT, by=by, target=PATCH_TARGET, wrong=PATCH_WRONG)

    torch.set_num_threads(1)  # as the runs above: a plain run is short
    try:
        patching = interleaved_times(
            {
                "run": lambda: model.run(CLEAN, return_weights=False),
                "layer_position": lambda: patch("layer-position"),
                "position": lambda: patch("position"),
            },
            repeat=repeat,
        )
    finally:
        torch.set_num_threads(threads)
    patch_tokens = len(model.tokenize(CLEAN).tokens)
    patch_rows = [
        [
            f"`activation_patching` by layer-position, `resid_pre`, {model.num_layers} layers × {patch_tokens} "
            "positions / one `run`",
            f"{patching['layer_position']:.2f} s / {patching['run'] * 1e3:.0f} ms",
            f"{patching['layer_position'] / patching['run']:.1f}",
        ],
        [
            "`activation_patching` by position (all layers at once), `resid_pre` / one `run`",
            f"{patching['position']:.2f} s",
            f"{patching['position'] / patching['run']:.1f}",
        ],
    ]
    if args.only == "patching":
        print(markdown_table(["what", "time", "ratio"], patch_rows))  # printed only: the report needs every row
        return
    attribution, attribution_rows = attribution_figures(model, repeat)
    library = interleaved_times(
        {
            "inspect": lambda: attention_map(model, TEXT),
            "ablate": lambda: head_ablation(model, TEXT, target=TARGET),
        },
        repeat=repeat,
    )
    with tempfile.TemporaryDirectory() as out:
        attnkit = [sys.executable, "-m", "attnkit"]
        commands = {
            "inspect": [*attnkit, "inspect", TEXT, "--out", out, "--quiet"],
            "ablate": [*attnkit, "heads", TEXT, "--ablate", "--target", TARGET, "--out", out, "--quiet"],
        }
        cli = _process_times(commands, repeat)

    data = {
        "text": TEXT,
        "tokens": tokens,
        "matmul_gflops": mm,
        **hooks,
        "library_seconds": library,
        "library_ablate_ratio": library["ablate"] / library["inspect"],
        "cli_seconds": cli,
        "cli_ablate_ratio": cli["ablate"] / cli["inspect"],
        "cli_ablate_target_ratio": ABLATION_TARGET_RATIO,
        "patching_texts": {"clean": CLEAN, "corrupt": CORRUPT},
        "patching_seconds": patching,
        "patching_layer_position_ratio_vs_run": patching["layer_position"] / patching["run"],
        "patching_position_ratio_vs_run": patching["position"] / patching["run"],
        "attribution": attribution,
    }
    rows += [
        [
            "`head_ablation` (270 heads) / `attention_map` (library)",
            f"{library['ablate']:.2f} s / {library['inspect']:.2f} s",
            f"{data['library_ablate_ratio']:.2f}",
        ],
        [
            "`attnkit heads --ablate` / `attnkit inspect` (fresh processes)",
            f"{cli['ablate']:.2f} s / {cli['inspect']:.2f} s",
            f"{data['cli_ablate_ratio']:.2f}",
        ],
        *patch_rows,
        *attribution_rows,
    ]
    markdown = (
        "## Analysis: hooks, head ablation and activation patching (SmolLM2)\n\n"
        f"On the 16-token text {TEXT!r}, target {TARGET!r}; runs and patching at 1 thread, ablation and inspect at "
        f"{torch.get_num_threads()} threads, torch.mm {mm:.0f} GFLOP/s. Ablation batches every head of a layer and all layers in one forward pass "
        "(about 4,200 layer passes of the text against 30 for one run), so in the library it costs what "
        "that many layer passes cost; the command line adds the same start-up, load and picture to both. "
        f"Target for the command: at most {ABLATION_TARGET_RATIO:.0f}×. Patching by position runs "
        f"the clean and corrupted texts {CLEAN!r} / {CORRUPT!r} once each, then branches one row per "
        "position off each layer of the corrupted run; the positions before the differing name hold the same "
        "activations in both runs and are not run.\n\n" + markdown_table(["what", "time", "ratio"], rows)
    )
    cache_data, cache_markdown = full_cache(model, repeat)
    markdown += "\n\n" + cache_markdown
    print(markdown)
    write_results("analysis", {**data, FULL_CACHE_KEY: cache_data}, markdown, update_docs=args.update_docs)


def long_ioi_pair(model: Any) -> tuple[str, str]:
    """The IOI pair after as much of :data:`STORY` as makes the clean text
    :data:`ATTRIBUTION_TOKENS` tokens long (the corrupted text has as many)."""
    for count in range(len(STORY) + 1):
        prefix = " ".join(STORY[:count]) + ". " if count else ""
        clean, corrupt = prefix + CLEAN, prefix + CORRUPT
        if len(model.tokenize(clean).tokens) == ATTRIBUTION_TOKENS:
            assert len(model.tokenize(corrupt).tokens) == ATTRIBUTION_TOKENS
            return clean, corrupt
    raise AssertionError(f"no prefix of the story makes the IOI text {ATTRIBUTION_TOKENS} tokens long")


def attribution_figures(model: Any, repeat: int) -> tuple[dict, list[list[str]]]:
    """Attribution patching of every head (and of every grid) at :data:`ATTRIBUTION_TOKENS`
    tokens against one run of the clean text, and every-block patching of the three blocks
    on the 14-token pair against one run and TransformerLens' ``get_act_patch_block_every``
    where it is installed; one thread, interleaved. The figures and the table's rows."""
    from attnkit.inspect.patching_grids import BLOCKS, EVERY, attribution_patching, every_block_patching
    from benchmarks.common import interleaved_samples, paired_ratio

    clean, corrupt = long_ioi_pair(model)
    tokens = {"target": PATCH_TARGET, "wrong": PATCH_WRONG}
    blocks = [(block, "layer-position") for block in BLOCKS]
    lens = _transformer_lens(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        long = interleaved_samples(
            {
                "run": lambda: model.run(clean, return_weights=False),
                "heads": lambda: attribution_patching(model, clean, corrupt, **tokens, grids=[("z", "head")]),
                "every": lambda: attribution_patching(model, clean, corrupt, **tokens, grids=EVERY),
            },
            repeat=repeat,
        )
        short_fns = {
            "run": lambda: model.run(CLEAN, return_weights=False),
            "blocks": lambda: every_block_patching(model, CLEAN, CORRUPT, **tokens, grids=blocks),
        }
        if lens is not None:
            short_fns["lens_blocks"] = _lens_block_every(model, lens)
        short = interleaved_samples(short_fns, repeat=repeat)
    finally:
        torch.set_num_threads(threads)
    median = {
        name: statistics.median(ts) for name, ts in {**long, **{f"short_{k}": v for k, v in short.items()}}.items()
    }
    data = {
        "tokens": ATTRIBUTION_TOKENS,
        "texts": {"clean": clean, "corrupt": corrupt},
        "seconds": median,
        "heads_ratio_vs_run": paired_ratio(long["heads"], long["run"]),
        "every_grid_ratio_vs_run": paired_ratio(long["every"], long["run"]),
        "blocks_ratio_vs_run": paired_ratio(short["blocks"], short["run"]),
        "lens_blocks_ratio_vs_blocks": (
            paired_ratio(short["lens_blocks"], short["blocks"]) if "lens_blocks" in short else None
        ),
    }
    heads = model.num_layers * model.num_heads
    rows = [
        [
            f"`attribution_patching` of every head ({heads}, `z` by head) at {ATTRIBUTION_TOKENS} tokens / one `run`",
            f"{median['heads']:.2f} s / {median['run'] * 1e3:.0f} ms",
            f"{data['heads_ratio_vs_run']:.1f}",
        ],
        [
            f"`attribution_patching` of all {len(EVERY)} grids at {ATTRIBUTION_TOKENS} tokens / one `run`",
            f"{median['every']:.2f} s",
            f"{data['every_grid_ratio_vs_run']:.1f}",
        ],
        [
            "`every_block_patching` of resid_pre, attn_out, mlp_out by layer-position (14 tokens) / one `run`",
            f"{median['short_blocks']:.2f} s / {median['short_run'] * 1e3:.0f} ms",
            f"{data['blocks_ratio_vs_run']:.1f}",
        ],
        [
            "TransformerLens `get_act_patch_block_every` / `every_block_patching`",
            f"{median['short_lens_blocks']:.2f} s" if lens is not None else "not installed",
            f"{data['lens_blocks_ratio_vs_blocks']:.1f}" if data["lens_blocks_ratio_vs_blocks"] is not None else "",
        ],
    ]
    return data, rows


def _lens_block_every(model: Any, lens: Any) -> Any:
    """TransformerLens' ``get_act_patch_block_every`` of the 14-token pair with the logit
    difference (as a function to time)."""
    from transformer_lens import patching

    clean_ids, corrupt_ids = model.tokenize(CLEAN).ids, model.tokenize(CORRUPT).ids
    mary, john = model.to_single_token(PATCH_TARGET), model.to_single_token(PATCH_WRONG)
    _, clean_cache = lens.run_with_cache(clean_ids)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, mary] - logits[0, -1, john]

    return lambda: patching.get_act_patch_block_every(lens, corrupt_ids, clean_cache, metric)


def full_cache(model: Any, repeat: int) -> tuple[dict, str]:
    """``run_with_cache`` of every name against ``run`` at each of :data:`CACHE_LENGTHS`,
    one thread, interleaved: the cache as returned (each attention layer's scores, pattern
    and per-head result computed when first read) and the cache with every entry read;
    TransformerLens' ``run_with_cache`` where it is installed. The figures and their
    Markdown subsection (a heading, sentences, the table)."""
    from benchmarks.common import interleaved_samples, paired_ratio

    lens = _transformer_lens(model)
    base = model.tokenize(CLEAN).ids[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows, lengths = [], {}
    try:
        for length in CACHE_LENGTHS:
            ids = base.repeat(length // len(base) + 1)[:length][None]  # [1, length]
            fns = {
                "run": lambda ids=ids: model.run(ids, return_weights=False),
                "cache": lambda ids=ids: model.run_with_cache(ids),
                "cache_read": lambda ids=ids: list(model.run_with_cache(ids)[1].values()),
            }
            if lens is not None:
                fns["lens"] = lambda ids=ids: lens.run_with_cache(ids)
            samples = interleaved_samples(fns, repeat=repeat)
            median = {name: statistics.median(ts) for name, ts in samples.items()}
            ratio = paired_ratio(samples["cache"], samples["run"])
            read_ratio = paired_ratio(samples["cache_read"], samples["run"])
            lens_ratio = paired_ratio(samples["lens"], samples["cache"]) if lens is not None else None
            lens_read_ratio = paired_ratio(samples["lens"], samples["cache_read"]) if lens is not None else None
            kept = _kept_bytes(model, ids)
            lengths[str(length)] = {
                "seconds": median,
                "cache_ratio_vs_run": ratio,
                "cache_read_ratio_vs_run": read_ratio,
                "lens_ratio_vs_cache": lens_ratio,
                "lens_ratio_vs_cache_read": lens_read_ratio,
                "cache_bytes": kept,
            }
            rows.append(
                [
                    str(length),
                    f"{median['run'] * 1e3:.0f} ms",
                    f"{median['cache'] * 1e3:.0f} ms, {kept['returned'] / 1e6:,.0f} MB",
                    f"{ratio:.3f} (≤ {FULL_CACHE_TARGET_RATIO})",
                    f"{median['cache_read'] * 1e3:.0f} ms, {kept['read'] / 1e6:,.0f} MB",
                    f"{read_ratio:.3f}",
                    f"{median['lens'] * 1e3:.0f} ms" if lens is not None else "not installed",
                    (
                        f"{lens_ratio:.2f} (≥ {LENS_TARGET_RATIO}), {lens_read_ratio:.2f}"
                        if lens_ratio is not None and lens_read_ratio is not None
                        else ""
                    ),
                ]
            )
    finally:
        torch.set_num_threads(threads)
    lens_name = "not installed" if lens is None else f"{type(lens).__name__} (transformer-lens {_lens_version()})"
    data = {
        "repeat": repeat,
        "lengths": lengths,
        "transformer_lens": lens_name,
        "targets": {"cache_vs_run": FULL_CACHE_TARGET_RATIO, "lens_vs_cache": LENS_TARGET_RATIO},
    }
    markdown = (
        "### Full cache against a plain run and TransformerLens\n\n"
        f"`run_with_cache` of all {len(model.hook_names())} names against `run(ids, return_weights=False)` on "
        f"copies of {CLEAN!r} cut to each length, one thread, {repeat} interleaved rounds, medians and paired "
        "ratios. The cache comes back with each attention layer's scores, pattern and per-head result left to be "
        "computed when first read; *every entry read* is `run_with_cache` followed by reading all of them, the "
        "whole cost of a cache that holds everything (MB: the tensors the cache holds, before and after the "
        f"reads). TransformerLens: {lens_name}'s `run_with_cache` on the same weights (eager attention, no weight "
        "processing), its ratios to attnkit's cache as returned and with every entry read (above 1: attnkit is "
        "faster).\n\n"
        + markdown_table(
            [
                "tokens",
                "run",
                "run_with_cache",
                "cache / run",
                "every entry read",
                "read / run",
                "TransformerLens",
                "TransformerLens / cache, / read",
            ],
            rows,
        )
    )
    return data, markdown


def _kept_bytes(model: Any, ids: torch.Tensor) -> dict[str, int]:
    """The bytes of the tensors a full cache of ``ids`` holds as returned (its entries
    computed on first read left out) and once every entry is read."""
    _, cache = model.run_with_cache(ids)
    unread = set(cache.unread())
    returned = sum(cache[name].nbytes for name in cache if name not in unread)
    return {"returned": returned, "read": sum(t.nbytes for t in cache.values())}


def write_full_cache(data: dict, markdown: str, *, update_docs: bool) -> None:
    """Put the full-cache figures into the analysis results already written (replacing the
    subsection of an earlier run), as a run of the whole script would."""
    from benchmarks.common import RESULTS

    previous = RESULTS / "analysis.json"
    results = json.loads(previous.read_text()) if previous.exists() else {}
    if "environment" in results:  # the rest was measured by an earlier run: say when and where
        # (kept from the first of several runs of the cache alone, which measured none of it)
        results.setdefault("environment_of_the_other_figures", results["environment"])
        del results["environment"]
    text = (RESULTS / "analysis.md").read_text() if (RESULTS / "analysis.md").exists() else ""
    text = text.split("\n### Full cache", 1)[0].rstrip()
    write_results(
        "analysis", {**results, FULL_CACHE_KEY: data}, f"{text}\n\n{markdown}".strip(), update_docs=update_docs
    )


def _lens_version() -> str:
    from importlib.metadata import version

    return version("transformer-lens")


def _transformer_lens(model: Any) -> Any:
    """TransformerLens on SmolLM2's weights without weight processing (as attnkit runs
    them), or ``None`` when ``transformer-lens`` is not installed: ``HookedTransformer``
    before TransformerLens 4, its ``TransformerBridge`` in compatibility mode from 4 on."""
    try:
        import transformer_lens
    except ImportError:
        return None
    import transformers

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local: nothing to ask the Hub
    hf = transformers.AutoModelForCausalLM.from_pretrained(model.path, attn_implementation="eager")
    if not hasattr(transformer_lens, "TransformerBridge"):
        return transformer_lens.HookedTransformer.from_pretrained_no_processing(name, hf_model=hf, device="cpu").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model.path)
    bridge = transformer_lens.TransformerBridge.boot_transformers(name, hf_model=hf, tokenizer=tokenizer, device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge.eval()


if __name__ == "__main__":
    main()
