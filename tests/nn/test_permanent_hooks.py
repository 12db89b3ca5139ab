"""Permanent hooks (HookedModule.add_hook / reset_hooks): kept on their points until reset,
acting on every pass and thread, before the hooks of a ``with`` block."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.nn.test_hooks import tiny_lm

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


def _zero_head(z):  # [b, h, s, d]
    z = z.clone()
    z[:, 1] = 0
    return z


def test_a_permanent_hook_equals_the_same_hook_in_a_block_until_reset():
    lm = tiny_lm()
    plain = lm(IDS)
    with lm.hooks({"decoder.layers.0.self_attn.z": _zero_head}):
        scoped = lm(IDS)
    lm.add_hook("decoder.layers.0.self_attn.z", _zero_head)
    assert lm.permanent_hooks() == {"decoder.layers.0.self_attn.z": 1}
    assert torch.equal(lm(IDS), scoped) and torch.equal(lm(IDS), scoped)  # every pass
    seen = {}
    thread = threading.Thread(target=lambda: seen.setdefault("out", lm(IDS)))
    thread.start()
    thread.join()
    assert torch.equal(seen["out"], scoped)  # every thread
    _, cache = lm.run_with_cache(IDS, names_filter=["decoder.layers.0.self_attn.z"])
    assert not cache["decoder.layers.0.self_attn.z"][:, 1].any()  # the cache sees the replaced activation
    lm.reset_hooks()
    assert lm.permanent_hooks() == {} and torch.equal(lm(IDS), plain)


def test_permanent_hooks_run_before_the_blocks_hooks_and_make_a_point_active():
    lm = tiny_lm()
    order = []
    lm.add_hook("decoder.layers.1.self_attn.pattern", lambda p, hook: order.append(("permanent", hook.name)))
    with lm.hooks({"decoder.layers.1.self_attn.pattern": lambda p: order.append(("block", None))}):
        lm(IDS)
    assert order == [("permanent", "decoder.layers.1.self_attn.pattern"), ("block", None)]
    lm.reset_hooks()
    # A pattern replaced permanently is used (the layer leaves its fused kernel for it).
    lm.add_hook("decoder.layers.1.self_attn.pattern", lambda p: torch.zeros_like(p))
    zeroed = lm(IDS)
    lm.reset_hooks()
    with lm.hooks({"decoder.layers.1.self_attn.pattern": lambda p: torch.zeros_like(p)}):
        assert torch.equal(lm(IDS), zeroed)


def test_add_hook_refuses_unknown_names_and_non_functions():
    lm = tiny_lm()
    with pytest.raises(ValueError, match="unknown hook name"):
        lm.add_hook("decoder.layers.9.self_attn.z", _zero_head)
    with pytest.raises(TypeError, match="must be a function"):
        lm.add_hook("decoder.layers.0.self_attn.z", 3)  # type: ignore[arg-type]
    assert lm.permanent_hooks() == {}
