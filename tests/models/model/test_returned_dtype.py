"""The dtype of what a run hands out: half precision widened to float32, float32 and float64
kept (a module made float64 with ``model.module.double()`` gives float64 logits and hidden
states, as its hooks and caches do)."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.models.model.runs import returned_float


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_returned_float_widens_half_precision_and_keeps_the_rest(dtype, expected):
    t = torch.ones(2, dtype=dtype)
    assert returned_float(t).dtype == expected


def test_a_float64_module_runs_in_float64_end_to_end(tiny_family_folder, tiny_t5_path):
    model = models.load(tiny_family_folder("llama_linear"))
    model.module.double()
    ids = model.tokenize("the cat sat on the mat").ids
    run = model.run(ids, return_weights=[0])
    assert run.logits.dtype == run.last_hidden_state.dtype == torch.float64
    hooked = model.run_with_hooks(ids, hooks={}).logits
    assert torch.equal(run.logits, hooked)
    (batched,) = model.run_batch([ids[0]], return_weights=[0])
    assert batched.logits.dtype == batched.last_hidden_state.dtype == torch.float64
    torch.testing.assert_close(batched.logits, run.logits, rtol=1e-12, atol=1e-12)

    t5 = models.load(tiny_t5_path)
    t5.module.double()
    pair = t5.run_encoder_decoder("the cat", "a dog")
    assert pair.logits.dtype == pair.encoder_last_hidden_state.dtype == torch.float64


def test_a_bfloat16_model_hands_out_float32(tiny_family_folder):
    model = models.load(tiny_family_folder("llama_linear"), dtype="bfloat16")
    run = model.run("the cat sat", return_weights=[0])
    assert run.logits.dtype == run.last_hidden_state.dtype == torch.float32
