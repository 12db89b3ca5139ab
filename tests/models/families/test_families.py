"""Every decoder family against transformers' eager implementation on the same tiny random
checkpoint (tests/fixtures/tiny_families.py): logits, every layer's attention weights, and
greedy generation with the KV cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from attnkit import models
from tests.fixtures.tiny_families import CASES, MOE_CASES, TEXT_LENGTH, VOCAB, family_of_case

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(CASES | MOE_CASES))
def tiny(request, tiny_family_folder) -> tuple[str, Path]:
    """``(case, folder)`` of one family's tiny checkpoint."""
    return request.param, tiny_family_folder(request.param)


def _hf(folder: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(1))


def test_logits_and_every_attention_map_match_transformers(tiny) -> None:
    case, folder = tiny
    model = models.load(folder)
    assert model.family == family_of_case(case) and model.causal
    ids = _ids()
    run = model.run(ids)
    with torch.no_grad():
        expected = _hf(folder)(ids, output_attentions=True)
    scale = expected.logits.abs().max()
    assert (run.logits - expected.logits).abs().max() <= 1e-4 * scale
    assert len(expected.attentions) == model.num_layers
    for i, weights in enumerate(expected.attentions):
        torch.testing.assert_close(run.attentions[i], weights, rtol=0, atol=1e-5)


def test_greedy_generation_with_the_cache_equals_transformers(tiny) -> None:
    _, folder = tiny
    model = models.load(folder)
    ids = _ids()
    ours = list(model.generate_ids(ids, max_new_tokens=8))
    with torch.no_grad():
        theirs = _hf(folder).generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert ours == theirs[0, TEXT_LENGTH:].tolist()


def test_the_settings_that_matter_are_exercised(tiny) -> None:
    case, folder = tiny
    config = models.load(folder).config
    if case in ("gpt_neox", "gemma2"):
        assert len(list(folder.glob("*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").is_file()
    if case in ("qwen2", "mistral", "mixtral", "gemma2", "gemma3_text"):
        assert any(w is not None and w < TEXT_LENGTH for w in config.windows)
    if case in ("gpt_neox", "phi3"):
        assert config.rotary_dim < config.head_dim
    if case == "gemma2":
        assert config.attention_softcap and config.logit_softcap
    if case.startswith("llama_"):
        assert config.ropes[0].scaling is not None
    if case in ("qwen2_moe", "deepseek_v3", "deepseek_v3_no_query_latent"):
        assert config.experts is not None and False in config.experts.layers and True in config.experts.layers
    if case == "deepseek_v3":
        latent = config.latent_attention
        assert latent is not None and latent.q_lora_rank and latent.interleaved_rotary
        assert config.ropes[0].scaling is not None and latent.scale != latent.qk_head_dim**-0.5  # YaRN's mscale
        assert config.experts is not None and config.experts.router.num_groups > config.experts.router.topk_groups
    if case == "deepseek_v3_no_query_latent":
        assert config.latent_attention is not None and config.latent_attention.q_lora_rank is None
        assert not config.latent_attention.interleaved_rotary


def test_models_families_lists_every_family(capsys) -> None:
    from attnkit.cli import main
    from attnkit.models.families.table import FAMILIES

    assert main(["models", "families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["model_type", "kind", "modules", "what", "its", "blocks", "have"]
    from attnkit.models.families.table import TESTED_BRIDGES

    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == list(FAMILIES) + list(TESTED_BRIDGES)
    assert all(row[1:3] == ["causal", "transformers"] for row in rows[len(FAMILIES) :])
    assert all(row[2] == "attnkit" for row in rows[: len(FAMILIES)])
    assert "sliding window on alternate layers" in next(line for line in lines if line.startswith("gemma2 "))


@pytest.mark.parametrize("case", ["qwen2", "gemma2"])  # two stand for all: the commands only see a Model
def test_commands_take_a_family_folder(case, capsys, tmp_path, monkeypatch, tiny_family_folder) -> None:
    from attnkit.cli import main

    folder = Path(shutil.copytree(tiny_family_folder(case), tmp_path / f"tiny-{case}"))
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "w1 w2 w3", "--model", str(folder), "--max-new-tokens", "3"]) == 0
    assert len(capsys.readouterr().out.split()) == 3
    assert main(["inspect", "w1 w2 w3 w4", "--model", str(folder), "--layer", "-1", "--format", "json"]) == 0
    assert f"{folder.name}_layer{models.load(folder).num_layers - 1}_head0.json" in capsys.readouterr().out


def test_run_batch_equals_one_run_per_text(tiny) -> None:
    _, folder = tiny
    model = models.load(folder)
    texts = ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11", "w5 w6 w7"]  # the longer passes every window
    for text, batched in zip(texts, model.run_batch(texts)):
        single = model.run(text)
        torch.testing.assert_close(batched.logits, single.logits, rtol=0, atol=1e-4)
        for i in range(model.num_layers):
            torch.testing.assert_close(batched.attentions[i], single.attentions[i], rtol=0, atol=1e-5)


def test_models_families_names_kinds_as_model_kind_does(capsys) -> None:
    """The table's kinds are :data:`attnkit.models.MODEL_KINDS`' words, each family's the
    one :func:`attnkit.models.model_kind` gives a model of it."""
    from attnkit.cli import main
    from attnkit.models import MODEL_KINDS
    from attnkit.models.families.table import FAMILIES

    assert main(["models", "families"]) == 0
    kinds = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(kinds.values()) == set(MODEL_KINDS)
    assert (kinds["llama"], kinds["bert"], kinds["t5"]) == ("causal", "bidirectional", "encoder-decoder")
    for model_type, family in FAMILIES.items():
        expected = "encoder-decoder" if family.encoder_decoder else "causal" if family.causal else "bidirectional"
        assert kinds[model_type] == expected
