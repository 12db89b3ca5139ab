"""The viewer's long view (`attnkit inspect --long --format html`) on a tiny random Gemma 3:
the page's embedded data, parsed back, equals the Python summaries, reduced maps and top
keys; its size stays within its bound and far below a map's; a page over --max-size is
refused before the model runs."""

from __future__ import annotations

import base64
import json
import re
import zlib

import numpy as np
import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.inspect.long_context import LayerScoring, LongContextRun, long_context_summaries, summarize_layer
from attnkit.viz.estimates import estimate_long_html
from attnkit.viz.viewer.long_view import QUANTISED_MAX, long_viewer_data, render_long_html

TEXT = " ".join(f"w{(i * 7) % 40 + 1}" for i in range(60))


def embedded(html: str) -> dict:
    """The JSON of the page's data element."""
    found = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', html, re.S)
    assert found is not None
    return json.loads(found.group(1))


def unpacked(text: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=dtype).reshape(shape)


def decoded_map(entry: dict, n: int) -> torch.Tensor:
    return torch.from_numpy(unpacked(entry["data"], "<u2", (n, n)).astype(np.float64) * entry["scale"])


@pytest.fixture(scope="module")
def gemma3(tiny_family_folder):
    folder = tiny_family_folder("gemma3_text")
    return folder, models.load(folder)


def test_page_data_equals_the_summaries_maps_and_top_keys(gemma3):
    _, model = gemma3
    run = long_context_summaries(model, TEXT, layers=[0, 1], top_k=3, window=5, map_block=8)
    ids, tokens, _ = model.prepare_input(TEXT)
    html = render_long_html(long_viewer_data(run, tokens, model_name=model.name, causal=model.causal))
    assert len(html.encode()) <= estimate_long_html(
        tokens, 2 * model.num_heads, top_k=3, block=8, model_name=model.name
    )
    data = embedded(html)
    s, n = ids.shape[1], 8
    assert (data["format"], data["tokens"], data["block"], data["top_k"]) == ("attnkit-viewer-long", tokens, 8, 3)
    assert [layer["layer"] for layer in data["layers"]] == [0, 1]
    for layer in data["layers"]:
        summary = run.summaries[layer["layer"]]
        assert layer["sliding_window"] == run.scorings[layer["layer"]].window
        assert [head["summary"] for head in layer["heads"]] == summary.head_table()
        for i, head in enumerate(layer["heads"]):
            assert head["head"] == summary.heads[i]
            for name, want in (("max", summary.block_max[i]), ("mean", summary.block_mean[i])):
                got = decoded_map(head[name], n)
                # uint16 scaled to the map's largest: within half a step of it.
                torch.testing.assert_close(
                    got, want.double(), rtol=0, atol=float(want.max()) / QUANTISED_MAX / 2 + 1e-12
                )
            keys = torch.from_numpy(unpacked(head["top_keys"], "<i4", (s, 3)).astype(np.int64))
            assert torch.equal(keys, summary.top_keys[i])
            weights = torch.from_numpy(unpacked(head["top_weights"], "<u2", (s, 3)).astype(np.float64)) / QUANTISED_MAX
            torch.testing.assert_close(
                weights, summary.top_weights[i].double(), rtol=0, atol=0.5 / QUANTISED_MAX + 1e-9
            )


def test_page_size_is_bounded_and_linear_in_the_text():
    torch.manual_seed(0)
    heads, sizes = 2, {}
    for s in (1024, 4096):
        q, k = torch.randn(heads, s, 16), torch.randn(1, s, 16)
        block = s // 256
        scoring = LayerScoring(scale=0.25)
        summary = summarize_layer(q, k, scoring, top_k=8, map_block=block)
        run = LongContextRun(
            ids=torch.zeros(s), summaries={0: summary}, logits=None, logits_at=[], scorings={0: scoring}
        )
        tokens = [f"t{i}" for i in range(s)]
        page = len(render_long_html(long_viewer_data(run, tokens, model_name="m", causal=True)).encode())
        assert page <= estimate_long_html(tokens, heads, top_k=8, block=block, model_name="m")
        sizes[s] = page
    # Four times the text, at most four times the page (the maps stay 256 x 256, the top
    # keys grow with s); the plain viewer's two maps at 4,096 tokens, as uint16, are 64 MiB.
    assert sizes[4096] < 4 * sizes[1024] and sizes[4096] < 4 * 2**20


def test_a_run_without_maps_or_with_some_rows_is_refused(gemma3):
    _, model = gemma3
    ids, tokens, _ = model.prepare_input(TEXT)
    no_map = long_context_summaries(model, TEXT, layers=[0])
    with pytest.raises(ValueError, match="has no block-reduced map"):
        long_viewer_data(no_map, tokens, model_name="m", causal=True)
    with pytest.raises(ValueError, match="tokens must name the run's 60 tokens"):
        long_viewer_data(no_map, tokens[:5], model_name="m", causal=True)
    with pytest.raises(ValueError, match="must be 'attnkit-viewer-long' version 1"):
        render_long_html({"format": "attnkit-viewer"})


@pytest.mark.slow
def test_inspect_long_writes_the_page_and_refuses_one_over_max_size(capsys, tmp_path, gemma3):
    folder, model = gemma3
    argv = ["inspect", "--long", TEXT, "--model", str(folder), "--top", "2", "--layers", "1", "--quiet"]
    code = main([*argv, "--format", "json,html", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err
    page = (tmp_path / "out" / "long_context.html").read_text()
    data = embedded(page)
    expected = long_context_summaries(model, TEXT, layers=[1], top_k=2, map_block=1)
    assert data["block"] == 1 and [h["summary"] for h in data["layers"][0]["heads"]] == expected.head_table()
    assert "long_context.html" in out
    code = main([*argv, "--format", "html", "--max-size", "50kB", "--out", str(tmp_path / "small")])
    out, err = capsys.readouterr()
    assert code != 0 and "the long view page of 4 heads (long_context.html)" in err and "--max-size" in err
    assert not (tmp_path / "small" / "long_context.html").exists()
