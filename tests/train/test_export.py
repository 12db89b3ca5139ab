"""A finished encoder–decoder run's folder loads with attnkit.models.load, as a T5 or BART
folder does: the same network, the same cross-attention and the same greedy output as
the trained model, in the library and in the commands."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attnkit import models
from attnkit.cli import main
from attnkit.nn import EncoderDecoderLM
from attnkit.train.loop import TrainConfig, build_for_config, run
from attnkit.train.tasks import EOS, make_task

# Slow (trains and exports tiny runs: about 3 s): outside make test-fast.
pytestmark = pytest.mark.slow

CONFIG = TrainConfig(
    task="reverse",
    length=5,
    symbols=6,
    d_model=16,
    heads=2,
    layers=2,
    ff=32,
    steps=40,
    batch_size=16,
    warmup=4,
    eval_size=20,
    checkpoint_every=40,
)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reverse")
    before = torch.get_num_threads()
    try:
        result = run(CONFIG, folder, progress=False, threads=1)
    finally:
        torch.set_num_threads(before)
    names = [path.name for path in result.files]
    assert names[-3:] == ["config.json", "model.safetensors", "tokenizer.json"]
    return folder


def trained(folder):
    """The trained model as training holds it, from the run's checkpoint."""
    from attnkit.train.checkpoint import load_checkpoint

    task = make_task(CONFIG.task, length=CONFIG.length, symbols=CONFIG.symbols)
    model = build_for_config(CONFIG, task)
    model.load_state_dict(load_checkpoint(folder / "checkpoint.pt")["model"])
    return model.eval(), task


def test_the_folder_loads_as_an_encoder_decoder_with_the_trained_weights(run_folder) -> None:
    model = models.load(run_folder)
    net, _ = trained(run_folder)
    assert model.family == "transformer" and model.encoder_decoder and isinstance(model.module, EncoderDecoderLM)
    assert (model.num_layers, model.num_decoder_layers, model.num_heads) == (2, 2, 2)
    assert model.module.target_embedding.token is model.module.source_embedding.token
    loaded = model.module.state_dict()
    assert loaded.keys() == net.network.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in net.network.state_dict().items())


def test_run_encoder_decoder_shows_the_cross_attention_and_output_of_the_trained_model(run_folder) -> None:
    model = models.load(run_folder)
    net, task = trained(run_folder)
    source = "3 0 5 1 2"
    ids = torch.tensor([[task.vocab.index(word) for word in source.split()]])  # [1, 5]
    produced = net.generate(ids, 6)[0].tolist()  # up to six tokens, ideally the symbols reversed and </s>
    if EOS in produced:
        produced = produced[: produced.index(EOS) + 1]
    generated = model.run_encoder_decoder(source, max_new_tokens=6)
    assert generated.generated and generated.target_ids.tolist() == [produced]
    assert generated.source_tokens == source.split()
    maps = net.attention_maps(ids, torch.tensor([produced]))  # cross, [L, 1, h, s_tgt, 5]
    for layer in range(2):
        torch.testing.assert_close(generated.cross_attentions[layer], maps.weights[layer], rtol=0, atol=1e-6)
    given = model.run_encoder_decoder(source, "2 1 5 0 3")
    assert not given.generated and given.target_tokens == ["2", "1", "5", "0", "3"]
    assert given.decoder_input_tokens == ["<s>", "2", "1", "5", "0"]
    assert given.cross_attentions[0].shape == (1, 2, 5, 5)


def test_the_commands_take_the_run_folder(run_folder, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    command = ["inspect", "3 0 5 1 2", "--decoder-text", "2 1 5 0 3 </s>", "--model", str(run_folder)]
    assert main([*command, "--format", "json", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "cross-attention (target → source) · 5 source × 6 target tokens" in printed
    written = json.loads((tmp_path / "attnkit-out" / f"{run_folder.name}_cross_layer1_head0.json").read_text())
    assert written["attention"] == "cross" and written["key_tokens"] == ["3", "0", "5", "1", "2"]
    assert len(written["tokens"]) == 6 and written["tokens"][-1] == "</s>"
    assert main(["heads", "3 0 5 1 2", "--model", str(run_folder), "--align", "anti-diagonal", "-q"]) == 0
    assert "alignment" in capsys.readouterr().out


def test_a_symbol_outside_the_task_is_a_clear_error(run_folder) -> None:
    model = models.load(run_folder)
    vocabulary = "'<s>', '</s>', '0', '1', '2', '3', '4', '5'"
    with pytest.raises(ValueError, match=rf"tokenizer.json has no token for '9', 'x'; its vocabulary is {vocabulary}$"):
        model.run_encoder_decoder("3 0 9 x 9")


def test_a_decoder_only_run_writes_no_model_folder(tmp_path) -> None:
    config = dataclasses.replace(CONFIG, task="addition", digits=2, steps=2, layers=1)
    result = run(config, tmp_path, progress=False, threads=1)
    assert not (tmp_path / "config.json").exists()
    assert [path.name for path in result.files] == ["checkpoint.pt", "metrics.json", "self_attention.png"]
