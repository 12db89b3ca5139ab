"""The mixture-of-experts router against transformers' DeepSeek-V3 router (sigmoid scores,
correction bias, group-limited top-k, scaling), the block's hook points and checks."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import MixtureOfExperts, Router, RouterConfig, ablate_experts

transformers = pytest.importorskip("transformers")


def test_sigmoid_router_with_groups_equals_transformers_deepseek_router() -> None:
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    config = transformers.DeepseekV3Config(
        hidden_size=32, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5
    )
    torch.manual_seed(0)
    hf = deepseek.DeepseekV3TopkRouter(config)
    torch.nn.init.normal_(hf.weight, std=0.3)
    hf.e_score_correction_bias.normal_(0, 0.3)
    ours = Router(
        32,
        RouterConfig(
            16, 4, scoring="sigmoid", routed_scaling_factor=2.5, num_groups=4, topk_groups=2, correction_bias=True
        ),
    )
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(50, 32)
    _, weights, indices = hf(x)
    chosen, ours_weights = ours.choose(ours.scores(x))
    order, ours_order = indices.argsort(-1), chosen.argsort(-1)
    assert torch.equal(indices.gather(-1, order), chosen.gather(-1, ours_order))
    torch.testing.assert_close(ours_weights.gather(-1, ours_order), weights.gather(-1, order), rtol=0, atol=1e-6)
    # Only experts of the two best groups are chosen.
    assert all(len(set((row // 4).tolist())) <= 2 for row in chosen)


def test_hook_points_shapes_and_ablation() -> None:
    torch.manual_seed(0)
    block = MixtureOfExperts(16, 8, RouterConfig(4, 2), shared_dim=12, shared_gate=True)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 5, 16)
    seen = {}
    for name in ("router_scores", "chosen_experts", "expert_weights"):
        getattr(block, name).permanent = ((lambda t, p, name=name: seen.__setitem__(name, t)),)
    plain = block(x)
    assert seen["router_scores"].shape == (2, 5, 4) and seen["chosen_experts"].shape == (2, 5, 2)
    torch.testing.assert_close(seen["expert_weights"].sum(-1), torch.ones(2, 5))
    block.expert_weights.permanent = ((lambda t, p: ablate_experts([0, 1, 2, 3])(t)),)
    only_shared = block(x)
    block.expert_weights.permanent = ()
    expected = torch.sigmoid(block.shared_expert_gate(x)) * block.shared_experts(x)
    torch.testing.assert_close(only_shared, expected)
    assert not torch.allclose(plain, only_shared)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"num_experts": 4, "top_k": 5}, "top_k must be at most"),
        ({"num_experts": 6, "top_k": 2, "num_groups": 4}, "num_groups must divide"),
        ({"num_experts": 8, "top_k": 6, "num_groups": 4, "topk_groups": 2}, "cannot hold"),
        ({"num_experts": 8, "top_k": 2, "scoring": "tanh"}, "scoring must be"),
    ],
)
def test_router_config_refuses(fields, error) -> None:
    with pytest.raises(ValueError, match=error):
        RouterConfig(**fields)


def test_ablate_experts_refuses_bad_indices() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        ablate_experts([])
    with pytest.raises(ValueError, match="out of range"):
        ablate_experts([7])(torch.zeros(1, 2, 4))
