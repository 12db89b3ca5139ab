"""Every tensor of a checkpoint is used, or the load is refused naming it (but for the
known redundant tensors docs/models.md lists); BART with untied embeddings equals
transformers; configuration booleans are JSON booleans."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit import models
from tests.fixtures.crafted import tokenizer_json
from tests.fixtures.encoder_decoder_checkpoints import write_bart, write_t5
from tests.fixtures.tiny_families import write_tiny_family

transformers = pytest.importorskip("transformers")

SOURCE = "the big dog ran to the red house"
TARGET = "a cat sat on the mat"


def _write_bert(folder: Path) -> Path:
    words = [f"w{i}" for i in range(31)] + ["[UNK]"]
    config = transformers.BertConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(words)))
    return folder


def _write_trained(folder: Path) -> Path:
    from attnkit.train.loop import TrainConfig, run

    config = TrainConfig(
        task="reverse", length=5, symbols=6, d_model=8, heads=2, layers=1, ff=16, steps=2, batch_size=4,
        warmup=1, eval_size=4, checkpoint_every=2,
    )  # fmt: skip
    before = torch.get_num_threads()
    try:
        run(config, folder, progress=False, threads=1)
    finally:
        torch.set_num_threads(before)
    return folder


WRITERS = {"bert": _write_bert, "t5": write_t5, "bart": write_bart, "transformer": _write_trained}


# Per family: a tensor the network has no place for, named as the family names its
# tensors (a bias on a projection without one, a norm the family does not have).
EXTRA = {
    "gpt2": "transformer.h.0.attn.c_attn.scale",
    "gpt_neox": "gpt_neox.layers.0.attention.q_norm.weight",
    "qwen2": "model.layers.0.self_attn.o_proj.bias",
    "qwen3": "model.layers.0.self_attn.q_proj.bias",
    "mistral": "model.layers.0.self_attn.q_proj.bias",
    "gemma2": "model.layers.0.self_attn.q_proj.bias",
    "gemma3_text": "model.layers.0.self_attn.q_proj.bias",
    "phi3": "model.layers.0.self_attn.qkv_proj.bias",
    "llama_linear": "model.layers.0.self_attn.q_proj.bias",
    "bert": "encoder.layer.0.attention.self.query.scale",
    "t5": "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight",
    "bart": "model.encoder.layer_norm.weight",
    "transformer": "encoder.layers.0.self_attn.q_proj.scale",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("every-tensor")

    def folder(case: str) -> Path:
        if not (root / case).exists():
            WRITERS.get(case, partial(write_tiny_family, case))(root / case)
        return root / case

    return folder


def _with_tensor(source: Path, folder: Path, name: str, value: torch.Tensor) -> Path:
    """A copy of the checkpoint ``source`` with one more tensor in its first weights file."""
    shutil.copytree(source, folder)
    first = sorted(folder.glob("*.safetensors"))[0]
    save_file(load_file(first) | {name: value}, first, metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"][name] = first.name
        index.write_text(json.dumps(data))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(EXTRA))
def test_a_tensor_the_model_would_not_use_is_refused_by_name(written, tmp_path: Path, case: str) -> None:
    source = written(case)
    models.load(source)  # the checkpoint as written loads
    for name in (EXTRA[case], "extra_unused.weight"):
        folder = _with_tensor(source, tmp_path / name, name, torch.zeros(4))
        with pytest.raises(models.CheckpointError, match=f"unexpected \\[{name}\\]") as caught:
            models.load(folder)
        assert caught.value.field == name
        assert "\n" not in str(caught.value)


@pytest.fixture(scope="module")
def untied_bart(tmp_path_factory: pytest.TempPathFactory):
    folder = write_bart(
        tmp_path_factory.mktemp("untied") / "bart", tie_word_embeddings=False, scale_embedding=True, seed=3
    )
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    return folder, models.load(folder), hf


def test_an_untied_bart_reads_its_own_embeddings_and_head_as_transformers_does(untied_bart) -> None:
    folder, model, hf = untied_bart
    tensors = load_file(folder / "model.safetensors")
    # transformers wrote four different matrices: the stacks' and the head's are used.
    shared = tensors["model.shared.weight"]
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        assert not torch.equal(tensors[name], shared)
    source = model.tokenize(SOURCE).ids  # [1, s_src]
    target = torch.cat((torch.tensor([[2]]), model.tokenize(TARGET).ids), dim=1)  # [1, s_tgt]
    with torch.no_grad():
        want = hf(input_ids=source, decoder_input_ids=target, output_attentions=True)
        got = model.module(source, target, return_weights=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5)
    for mine, theirs in zip(got.decoder_weights, want.cross_attentions, strict=True):
        torch.testing.assert_close(mine.cross_attention, theirs, rtol=0, atol=1e-5)


def test_an_untied_bart_without_its_own_head_is_refused_naming_it(untied_bart, tmp_path: Path) -> None:
    folder = tmp_path / "no-head"
    shutil.copytree(untied_bart[0], folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(models.CheckpointError, match=r"missing \[head\.proj\.weight\]"):
        models.load(folder)


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("bart", "tie_word_embeddings"),
        ("bart", "scale_embedding"),
        ("t5", "tie_word_embeddings"),
        ("llama_linear", "tie_word_embeddings"),
        ("llama_linear", "attention_bias"),
        ("gpt2", "tie_word_embeddings"),
        ("gpt_neox", "use_parallel_residual"),
        ("qwen2", "use_sliding_window"),
    ],
)
def test_a_boolean_written_as_a_string_is_refused_naming_file_and_field(
    written, tmp_path: Path, case: str, field: str
) -> None:
    folder = tmp_path / case
    shutil.copytree(written(case), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {field: "false"}))
    with pytest.raises(models.CheckpointError, match=f"{field} must be true or false, got 'false'") as caught:
        models.load(folder)
    assert caught.value.field == field
    assert "config.json" in str(caught.value) and "\n" not in str(caught.value)
