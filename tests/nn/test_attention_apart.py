"""``attnkit.nn.attention`` holds the attention alone: nothing it imports, directly or
through another module, records hooks or defers activations to a cache; the hook points
come from :mod:`attnkit.nn.hooked_attention`, built on it."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import Attention, AttentionConfig, HookedModule, MultiHeadAttention, RotaryEmbedding
from tests.nn.helpers import assert_close
from tests.test_layering import import_graph

HOOK_AND_DEFERRAL_MODULES = {"attnkit.nn.hooks", "attnkit.nn.activation_cache", "attnkit.nn.hooked_attention"}


def imported_by(module: str) -> set[str]:
    """Every attnkit module ``module`` imports, directly or through others."""
    graph, seen, todo = import_graph(), set(), [module]
    while todo:
        for imported in graph.get(todo.pop(), set()) - seen:
            seen.add(imported)
            todo.append(imported)
    return seen


def test_the_attention_module_imports_no_hook_or_deferral_code():
    imported = imported_by("attnkit.nn.attention")
    assert "attnkit.nn.kv_cache" in imported  # the walker follows its imports
    assert not imported & HOOK_AND_DEFERRAL_MODULES, sorted(imported & HOOK_AND_DEFERRAL_MODULES)


class _Holder(HookedModule):
    def __init__(self, attention: MultiHeadAttention) -> None:
        super().__init__()
        self.attn = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, causal=True)


def test_the_hooked_attention_computes_what_the_attention_alone_computes():
    torch.manual_seed(0)
    config = AttentionConfig(16, 4, num_kv_heads=2, softcap=5.0, window=3)
    plain = Attention(config, positional=RotaryEmbedding(4))
    hooked = MultiHeadAttention(config, positional=RotaryEmbedding(4))
    hooked.load_state_dict(plain.state_dict())
    assert not any(name in dict(plain.named_modules()) for name in ("q", "scores", "z"))
    x = torch.randn(2, 6, 16)
    expected = plain(x, causal=True, return_weights=True)
    got = hooked(x, causal=True, return_weights=True)
    assert torch.equal(got.output, expected.output)
    assert torch.equal(got.weights, expected.weights)
    assert_close(hooked(x[:, :1]), plain(x[:, :1]))
    # Its points act: every step of the plain forward pass passes through them.
    holder = _Holder(hooked)
    _, cache = holder.run_with_cache(x)
    points = ["q_unrotated", "k_unrotated", "q", "k", "v", "scores", "pattern", "z", "result"]
    assert holder.hook_names() == [f"attn.{name}" for name in points]
    assert sorted(cache) == sorted(holder.hook_names())
    assert_close(cache["attn.pattern"], expected.weights)
    doubled = holder.run_with_hooks(x, hooks={"attn.v": lambda v: 2 * v})
    assert_close(doubled, 2 * expected.output - plain.out_proj.bias)


def test_the_old_path_of_multi_head_attention_still_gives_it_with_a_warning():
    import attnkit.nn.attention as attention_module

    with pytest.warns(DeprecationWarning, match=r"attnkit\.nn\.attention\.MultiHeadAttention is now"):
        moved = attention_module.MultiHeadAttention
    assert moved is MultiHeadAttention
