"""Weights in bfloat16 (``models.load(dtype=...)``, ``--dtype``): every decoder family
against transformers in bfloat16 on the same tiny random checkpoint, and results handed
back in float32 whatever the weights are.

Tolerances: bfloat16 keeps 8 significant bits (a relative rounding step of 2^-8), and the
two implementations round in different orders (fused projections, the scale applied to
the queries or to the scores, soft-capping), so logits are compared within 2^-3 of the
largest logit; on these checkpoints the largest difference measured was 6.5% (Gemma 2, whose
final soft-capping bounds the logits to 1.5). Attention weights (probabilities in [0, 1])
are formed in float32 from the layer's bfloat16 scores, beside the fused kernel's output
(attnkit.nn.WeightSelection), where transformers' eager attention rounds them to bfloat16
and multiplies them by the values: the first layer's maps, which read the same inputs, are
compared within 2^-8 (measured: 0.004, half a bfloat16 step at 1), later layers', whose
inputs went through the two kernels' different roundings, within 2^-4 (measured: 0.057,
Qwen 2's third layer).

Greedy tokens are those of transformers. A mixture of experts (Mixtral, Qwen-MoE,
DeepSeek-V3) may part from them only at a step where transformers' own bfloat16 logits of the
two tokens are within one bfloat16 rounding step (2^-7 of the largest logit): a tie that
rounding decides (measured: Qwen2-MoE's seventh token, whose two best logits transformers
rounds to the same 4.0938 and float32 puts 0.028 apart, attnkit choosing float32's token).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnkit import models
from attnkit.models.loading import choose_dtype
from tests.fixtures.tiny_families import CASES, MOE_CASES, TEXT_LENGTH, VOCAB

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(CASES | MOE_CASES))
def tiny(request, tiny_family_folder) -> Path:
    return tiny_family_folder(request.param)


def _assert_same_greedy_tokens(ours: list[int], theirs: list[int], ids: torch.Tensor, reference, *, ties: bool) -> None:
    """``ours == theirs``; with ``ties``, up to a step whose two tokens transformers' logits
    tie within one bfloat16 rounding step."""
    for step, (mine, its) in enumerate(zip(ours, theirs, strict=True)):
        if mine == its:
            continue
        assert ties, f"token {step}: {mine} where transformers chose {its} ({ours} vs {theirs})"
        with torch.no_grad():
            logits = reference(torch.cat([ids, torch.tensor([theirs[:step]])], 1)).logits[0, -1].float()
        assert (logits[mine] - logits[its]).abs() <= 2**-7 * logits.abs().max(), (step, ours, theirs)
        return


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(1))


def test_bfloat16_equals_transformers_in_bfloat16(tiny: Path) -> None:
    model = models.load(tiny, dtype="bfloat16")
    assert {p.dtype for p in model.module.parameters()} == {torch.bfloat16}
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tiny, attn_implementation="eager", dtype=torch.bfloat16
    ).eval()
    ids = _ids()
    run = model.run(ids)
    with torch.no_grad():
        expected = reference(ids, output_attentions=True)
    assert run.logits.dtype == run.last_hidden_state.dtype == torch.float32
    assert (run.logits - expected.logits.float()).abs().max() <= 2**-3 * expected.logits.float().abs().max()
    for i, weights in enumerate(expected.attentions):
        assert run.attentions[i].dtype == torch.float32
        torch.testing.assert_close(run.attentions[i], weights.float(), rtol=0, atol=2**-8 if i == 0 else 2**-4)
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    ours = list(model.generate_ids(ids, max_new_tokens=8))
    _assert_same_greedy_tokens(ours, theirs[0, TEXT_LENGTH:].tolist(), ids, reference, ties=tiny.name in MOE_CASES)


def test_analysis_results_are_float32_with_bfloat16_weights(tiny_family_folder) -> None:
    from attnkit.inspect.interventions import activation_patching, head_ablation

    model = models.load(tiny_family_folder("llama_linear"), dtype=torch.bfloat16)
    text, corrupt = "w1 w2 w3 w4 w5", "w1 w2 w9 w4 w5"
    (batch,) = model.run_batch([text])
    assert all(w.dtype == torch.float32 for w in batch.attentions.values())
    assert head_ablation(model, text, target="w6").effects.dtype == torch.float32
    patched = activation_patching(model, text, corrupt, target="w6", wrong="w7")
    assert patched.effects.dtype == torch.float32 and torch.isfinite(patched.effects).all()


def test_auto_is_float32_on_the_cpu_and_the_checkpoints_dtype_on_a_gpu() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert choose_dtype("auto", cpu, {"torch_dtype": "bfloat16"}) == torch.float32
    assert choose_dtype("auto", gpu, {"torch_dtype": "bfloat16"}) == torch.bfloat16
    assert choose_dtype("auto", gpu, {"dtype": "float16"}) == torch.float16
    assert choose_dtype("auto", gpu, {}) == torch.float32
    assert choose_dtype("auto", gpu, {"torch_dtype": "int8"}) == torch.float32
    assert choose_dtype("float16", cpu, {}) == torch.float16
    with pytest.raises(TypeError, match="got torch.int64"):
        choose_dtype(torch.int64, cpu, {})


def test_the_command_line_takes_dtype(tiny_family_folder, tmp_path: Path, capsys) -> None:
    from attnkit.cli import main

    folder = tiny_family_folder("llama_linear")
    out = tmp_path / "out"
    args = ["inspect", "w1 w2 w3", "--model", str(folder), "--dtype", "bfloat16", "--format", "json", "--out", str(out)]
    assert main([*args, "-q"]) == 0, capsys.readouterr().err
    assert len(list(out.glob("*.json"))) == 1
    with pytest.raises(SystemExit) as exited:
        main(["inspect", "w1", "--model", str(folder), "--dtype", "int8"])
    assert exited.value.code == 2
    assert "invalid choice: 'int8'" in capsys.readouterr().err
