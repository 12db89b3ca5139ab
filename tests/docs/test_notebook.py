"""docs/notebooks/tutorial.ipynb, executed in a Jupyter kernel without a network: by the Hub
name it loads, against a tiny checkpoint of TinyLlama-1.1B-Chat's shape that the test writes
into a Hugging Face cache layout; and with SmolLM2 where that name is not in the cache, whose
outputs the file keeps so that it reads on GitHub."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "notebooks" / "tutorial.ipynb"
HUB_NAME = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
COMMIT = "c" * 40
LABELS = "['The', 'cat', 'sat', 'on', 'the', 'mat', '.']"


def executed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub_cache: Path) -> list:
    """The notebook's code cells after running it in a fresh kernel with ``hub_cache`` as the
    Hugging Face cache, offline."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def shown(cell) -> dict:
    """What a cell displays, by MIME type."""
    return {
        k: v for o in cell.outputs if o.output_type in ("execute_result", "display_data") for k, v in o.data.items()
    }


def write_tiny_chat_model(cache: Path) -> None:
    """A random checkpoint of TinyLlama-1.1B-Chat's shape made small (8 query heads sharing
    one key/value head, as its 32 share 4; 2 layers), with its chat template, at ``main`` of
    its Hub name."""
    import torch
    import transformers

    from tests.fixtures.chat import TINYLLAMA_TEMPLATE
    from tests.fixtures.crafted import byte_level_tokenizer_json

    repo = cache / ("models--" + HUB_NAME.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    folder = repo / "snapshots" / COMMIT
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    words = ["The", "cat", "sat", "on", "the", "mat", "."]
    (folder / "tokenizer.json").write_text(json.dumps(byte_level_tokenizer_json(words)))
    tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TINYLLAMA_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def test_the_notebook_loads_the_chat_model_by_its_hub_name(tmp_path, monkeypatch):
    write_tiny_chat_model(tmp_path / "hub")
    cells = executed(tmp_path, monkeypatch, tmp_path / "hub")
    assert not [o for cell in cells for o in cell.outputs if o.output_type == "error"]
    assert stdout(cells[0]).strip() == f"{HUB_NAME}: 2 layers, 8 heads"
    assert stdout(cells[1]).strip() == LABELS
    assert "image/png" in shown(cells[2])
    assert len(stdout(cells[3]).splitlines()) == 7
    viewer = shown(cells[4])["text/html"]
    assert "<iframe" in viewer and "attnkit" in viewer
    # The chat cell: the message in TinyLlama's template, its turns, and the viewer of them.
    assert [line.split(":")[0].strip() for line in stdout(cells[5]).splitlines()] == ["user", "assistant"]
    assert '"turns":[{"role":"user"' in html.unescape(shown(cells[5])["text/html"]).replace(" ", "")


@pytest.mark.slow
def test_the_outputs_kept_in_the_file_are_what_it_prints_with_smollm2(tmp_path, monkeypatch, smollm2_path):
    kept = [cell for cell in nbformat.read(NOTEBOOK, as_version=4).cells if cell.cell_type == "code"]
    assert all(cell.outputs for cell in kept), "every code cell keeps its outputs, to read on GitHub"
    cells = executed(tmp_path, monkeypatch, tmp_path / "empty-hub")
    assert stdout(cells[0]).strip() == "smollm2: 30 layers, 9 heads" and stdout(cells[1]).strip() == LABELS
    assert [stdout(cell) for cell in cells] == [stdout(cell) for cell in kept]
    assert {k for cell in kept for k in shown(cell)} >= {"image/png", "text/html"}


def test_the_notebook_speaks_only_of_attnkit():
    """Its words and what it prints (the viewer it embeds is the page the viewer's tests read)."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    text = "\n".join(cell.source + "".join(stdout(cell) for _ in [0] if cell.cell_type == "code") for cell in cells)
    assert "attnkit" in text and not re.search(r"\bnotes?\b|\bseeds?\b", text, re.I)
