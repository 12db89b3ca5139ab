"""Cache entries computed when first read (attnkit.nn.activation_cache.DeferredActivations):
a pass that only caches an attention layer's scores, pattern and per-head result leaves
them to be computed from its recorded queries, keys and head outputs; what a read returns
is what a pass that formed them (because a hook was on them) records, bit for bit, for
every kind of score, mask and bias; they are formed during the pass whenever they could
not be recomputed later (gradients, a KV cache); and nothing done after the pass changes
what a read (or a pickle) gives: not the module's weights or options, not the caller's
mask or bias, not the cached queries, keys and head outputs, in place, through ``.data``
or through a NumPy view. A change the cache cannot undo makes the read raise."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest
import torch

from attnkit import masks
from attnkit.nn import (
    AdditiveAttention,
    ALiBi,
    AttentionConfig,
    DecoderLM,
    DecoderLMConfig,
    KVCache,
    MultiHeadAttention,
    RelativePositionBias,
    Transformer,
    TransformerConfig,
)
from attnkit.nn.activation_cache import DeferredActivations, private_copy, snapshot
from attnkit.nn.hooks import HookedModule

DEFERRED = ("scores", "pattern", "result")


class OneAttention(HookedModule):
    """A hooked module around one attention layer, attending causally or under a mask."""

    def __init__(self, attention: MultiHeadAttention) -> None:
        super().__init__()
        self.attn = attention

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | masks.Mask | None = None, position_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.attn(x, causal=mask is None, mask=mask, position_bias=position_bias)


def formed_during_the_pass(module: HookedModule, *args) -> dict[str, torch.Tensor]:
    """Every activation of a pass with a reading hook on each deferrable point: the pass
    forms them, as it does when a hook may replace them."""
    names = [name for name in module.hook_names() if name.endswith(DEFERRED)]
    with torch.no_grad(), module.hook_session({name: lambda t: None for name in names}, names_filter=None) as cache:
        module(*args)
    assert cache.unread() == []
    return dict(cache)


def cached_without_hooks(module: HookedModule, *args):
    with torch.no_grad():
        return module.run_with_cache(*args)


ATTENTIONS: dict[str, Callable[[], MultiHeadAttention]] = {
    "grouped queries": lambda: MultiHeadAttention(AttentionConfig(16, 4, num_kv_heads=2)),
    "softcap and window": lambda: MultiHeadAttention(AttentionConfig(16, 2, softcap=5.0, window=3, scale=0.3)),
    "ALiBi": lambda: MultiHeadAttention(AttentionConfig(16, 4), positional=ALiBi(4)),
    "relative positions": lambda: MultiHeadAttention(
        AttentionConfig(16, 2, score="dot"), positional=RelativePositionBias(2, bidirectional=False)
    ),
    "additive score": lambda: MultiHeadAttention(AttentionConfig(16, 2), score_module=AdditiveAttention(8)),
}


@pytest.mark.parametrize("kind", list(ATTENTIONS))
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding mask"])
def test_a_read_returns_what_the_pass_would_have_formed_bit_for_bit(kind, masked) -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS[kind]()).eval()
    x = torch.randn(2, 7, 16)
    args = (x, torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]) if masked else (x,)
    out, cache = cached_without_hooks(module, *args)
    assert sorted(cache.unread()) == sorted(f"attn.{point}" for point in DEFERRED)
    formed = formed_during_the_pass(module, *args)
    assert list(cache) == list(formed)
    for name in formed:
        assert torch.equal(cache[name], formed[name]), name
    assert cache.unread() == [] and torch.equal(out, module(*args))


def test_a_decoder_lm_defers_every_layer_and_reads_compute_only_what_they_need() -> None:
    torch.manual_seed(0)
    lm = DecoderLM(
        DecoderLMConfig(
            16, 4, 32, vocab_size=20, num_layers=2, positional="rotary", num_kv_heads=2, norm="rms", bias=False
        )
    ).eval()
    ids = torch.randint(0, 20, (2, 6))
    _, cache = cached_without_hooks(lm, ids)
    assert len(cache.unread()) == 2 * len(DEFERRED)
    pattern = cache["pattern", 1]
    # One computation gives a layer's scores and pattern: reading one keeps both.
    assert "decoder.layers.1.self_attn.scores" not in cache.unread()
    assert sorted(cache.unread()) == [
        "decoder.layers.0.self_attn.pattern",
        "decoder.layers.0.self_attn.result",
        "decoder.layers.0.self_attn.scores",
        "decoder.layers.1.self_attn.result",
    ]
    assert torch.equal(pattern, formed_during_the_pass(lm, ids)["decoder.layers.1.self_attn.pattern"])
    # The per-head results still sum to the attention output.
    assert torch.allclose(cache["result", 0].sum(1), cache["attn_out", 0], atol=1e-6)


def test_a_filter_of_patterns_alone_keeps_no_scores_and_nested_caches_compute_their_own() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad(), module.hook_session(names_filter=None) as outer:
        with module.hook_session(names_filter=["attn.pattern"]) as inner:
            module(x)
    assert list(inner) == ["attn.pattern"] and inner.unread() == ["attn.pattern"]
    assert torch.equal(inner["attn.pattern"], outer["attn.pattern"])
    assert inner["attn.pattern"] is not outer["attn.pattern"]
    assert outer.unread() == ["attn.result"]  # the outer cache's pattern came with its scores


def test_the_cache_reads_as_a_mapping_of_tensors() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    _, cache = cached_without_hooks(module, torch.randn(1, 5, 16))
    assert len(cache) == len(module.hook_names()) and "attn.pattern" in cache and ("pattern", None) in cache
    assert ("pattern", 3) not in cache and "nothing" not in cache
    assert cache.unread() != []  # membership computes nothing
    as_dict = dict(cache)
    assert all(isinstance(t, torch.Tensor) for t in as_dict.values()) and cache.unread() == []
    del cache["attn.scores"]
    _, fresh = cached_without_hooks(module, torch.randn(1, 5, 16))
    copied = pickle.loads(pickle.dumps(fresh))  # torch.save pickles: every entry computed
    assert copied.unread() == [] and torch.equal(copied["attn.pattern"], fresh["attn.pattern"])
    assert "attn.scores" not in cache and repr(cache).startswith("ActivationCache(['attn.q'")


def _numpy_halves(t: torch.Tensor) -> None:
    view = t.detach().numpy()  # shares the tensor's memory; torch's version counter does not move
    view *= 0.5


def _padding_mask() -> torch.Tensor:
    return torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]  # [2, 1, 1, 7]


def _change_mask_and_attend_under_others(module: OneAttention, mask: torch.Tensor) -> None:
    mask.data.fill_(True)
    # Patterns formed under other masks since: the additive biases that patterns keep of the
    # last few masks no longer include this one's.
    for _ in range(5):
        formed_during_the_pass(module, torch.randn(2, 7, 16), _padding_mask())


def _alibi_bias(module: OneAttention) -> torch.Tensor:
    positional = module.attn.positional
    assert positional is not None
    return positional.score_bias(7, 7, device=torch.device("cpu"), dtype=torch.float32)  # [1, h, 7, 7]


# What is changed after the pass: the attention it is made with, the arguments of the pass
# (beyond x) and the change, given the module, the cache and those arguments.
CHANGES: dict[str, tuple[Callable[[], MultiHeadAttention], Callable, Callable]] = {
    "an optimizer step on the output projection": (
        ATTENTIONS["grouped queries"],
        lambda module: (),
        lambda module, cache, args: module.attn.out_proj.weight.mul_(2),
    ),
    "the output projection through .data": (
        ATTENTIONS["grouped queries"],
        lambda module: (),
        lambda module, cache, args: module.attn.out_proj.weight.data.mul_(0.5),
    ),
    "the output projection through a NumPy view": (
        ATTENTIONS["grouped queries"],
        lambda module: (),
        lambda module, cache, args: _numpy_halves(module.attn.out_proj.weight),
    ),
    "the scale": (
        ATTENTIONS["softcap and window"],
        lambda module: (),
        lambda module, cache, args: setattr(module.attn, "scale", 1.0),
    ),
    "the window": (
        ATTENTIONS["softcap and window"],
        lambda module: (),
        lambda module, cache, args: setattr(module.attn, "window", 1),
    ),
    "the soft cap": (
        ATTENTIONS["softcap and window"],
        lambda module: (),
        lambda module, cache, args: setattr(module.attn, "softcap", 1.0),
    ),
    "the score module through .data": (
        ATTENTIONS["additive score"],
        lambda module: (),
        lambda module, cache, args: module.attn.score.query_proj.weight.data.mul_(3),
    ),
    "the cached queries in place": (
        ATTENTIONS["grouped queries"],
        lambda module: (),
        lambda module, cache, args: cache["attn.q"].mul_(2),
    ),
    "the cached keys through .data": (
        ATTENTIONS["grouped queries"],
        lambda module: (),
        lambda module, cache, args: cache["attn.k"].data.mul_(2),
    ),
    "the cached head outputs through a NumPy view": (
        ATTENTIONS["grouped queries"],
        lambda module: (),
        lambda module, cache, args: _numpy_halves(cache["attn.z"]),
    ),
    "the caller's mask through .data": (
        ATTENTIONS["grouped queries"],
        lambda module: (_padding_mask(),),
        lambda module, cache, args: _change_mask_and_attend_under_others(module, args[0]),
    ),
    "the caller's position bias through .data": (
        ATTENTIONS["ALiBi"],
        lambda module: (None, _alibi_bias(module)),
        lambda module, cache, args: args[1].data.mul_(3),
    ),
}


@pytest.mark.parametrize("read", ["read", "pickled"])
@pytest.mark.parametrize("changed", list(CHANGES))
def test_nothing_changed_after_the_pass_changes_what_a_read_gives(changed, read) -> None:
    make, arguments, change = CHANGES[changed]
    torch.manual_seed(0)
    module = OneAttention(make()).eval()
    x = torch.randn(2, 7, 16)
    args = (x, *arguments(module))
    formed = formed_during_the_pass(module, *args)
    _, cache = cached_without_hooks(module, *args)
    assert sorted(cache.unread()) == sorted(f"attn.{point}" for point in DEFERRED)
    with torch.no_grad():
        change(module, cache, args[1:])
    # A pass now would differ, unless only the cache's tensors changed.
    now = formed_during_the_pass(module, *args)
    assert changed.startswith("the cached") or not all(torch.equal(now[n], formed[n]) for n in formed)
    if read == "pickled":  # torch.save pickles: only what the pass computed
        cache = pickle.loads(pickle.dumps(cache))
    for point in DEFERRED:
        assert torch.equal(cache[f"attn.{point}"], formed[f"attn.{point}"]), point


@pytest.mark.parametrize("how", ["in place", "through .data", "through a NumPy view"])
def test_the_tensor_a_mask_object_keeps_changed_after_the_pass_changes_no_read(how) -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    allowed = torch.ones(7, 7, dtype=torch.bool).tril()
    x = torch.randn(1, 7, 16)
    formed = formed_during_the_pass(module, x, masks.from_dense(allowed))
    _, cache = cached_without_hooks(module, x, masks.from_dense(allowed))  # the mask reads `allowed` itself
    target = {"in place": allowed, "through .data": allowed.data, "through a NumPy view": allowed.numpy()}[how]
    target[3:, :3] = False
    assert torch.equal(cache["attn.pattern"], formed["attn.pattern"])


@pytest.mark.parametrize("how", ["in place", "through .data"])
def test_cached_values_sharing_memory_with_the_queries_and_keys_change_no_read(how) -> None:
    torch.manual_seed(0)
    attention = ATTENTIONS["grouped queries"]()
    attention.pack_projections()  # two rows or fewer: queries, keys and values are views of one tensor
    module = OneAttention(attention).eval()
    x = torch.randn(1, 2, 16)
    formed = formed_during_the_pass(module, x)
    _, cache = cached_without_hooks(module, x)
    values = cache["attn.v"]
    memory = values.as_strided((values.untyped_storage().nbytes() // 4,), (1,), 0)  # queries and keys too
    (memory if how == "in place" else memory.data).mul_(3)
    for point in DEFERRED:
        assert torch.equal(cache[f"attn.{point}"], formed[f"attn.{point}"]), point


def test_a_hook_that_keeps_the_queries_cannot_change_the_pattern_later() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    x = torch.randn(1, 5, 16)
    formed = formed_during_the_pass(module, x)
    seen = []
    with torch.no_grad(), module.hook_session({"attn.q": seen.append}, names_filter=["attn.pattern"]) as cache:
        module(x)
    assert cache.unread() == ["attn.pattern"]
    seen[0].data.zero_()
    assert torch.equal(cache["attn.pattern"], formed["attn.pattern"])


def test_a_cache_copies_a_recorded_tensor_for_another_cache_before_handing_it_out() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    x = torch.randn(1, 5, 16)
    formed = formed_during_the_pass(module, x)
    with torch.no_grad(), module.hook_session(names_filter=["attn.pattern"]) as patterns:
        with module.hook_session(names_filter=["attn.q"]) as queries:
            module(x)
    queries["attn.q"].data.mul_(3)
    assert torch.equal(patterns["attn.pattern"], formed["attn.pattern"])


def test_a_read_after_an_input_changed_in_place_out_of_the_caches_sight_refuses() -> None:
    queries = torch.randn(1, 2, 3, 4)
    deferred = DeferredActivations(
        lambda queries, weight: (queries * weight,),
        {"queries": queries},
        what="attn scores and pattern",
        copies={"weight": snapshot(torch.ones(4))},
    )
    assert torch.equal(deferred.run()[0], queries)
    queries.add_(1)  # as a tensor sharing their memory would change them
    with pytest.raises(
        RuntimeError,
        match=r"the attn scores and pattern of this cache are computed when first read, from the queries that the "
        r"forward pass recorded, and the queries changed in place since .* read these entries before changing "
        r"cached tensors, or run the forward pass again",
    ):
        deferred.run()


def test_a_snapshot_is_shared_while_the_tensor_is_unchanged_and_keeps_its_layout() -> None:
    weight = torch.nn.Parameter(torch.randn(8, 6))
    first = snapshot(weight)
    assert snapshot(weight) is first and first.data_ptr() != weight.data_ptr()
    weight.data[2, 3] = -weight.data[2, 3]
    second = snapshot(weight)
    assert second is not first and torch.equal(second, weight) and not torch.equal(first, weight)
    zero = torch.zeros(3)
    kept = snapshot(zero)
    zero.data.neg_()  # -0.0: the same by ==, other bits
    assert snapshot(zero) is not kept
    for tensor in (
        torch.randn(4, 6).t(),
        torch.randn(2, 5, 6)[:, 1:3],
        torch.ones(1, 1, 1, 7, dtype=torch.bool).expand(2, 3, 7, 7),
        torch.randn(9)[3:],
    ):
        copy = private_copy(tensor)
        assert torch.equal(copy, tensor) and copy.stride() == tensor.stride()
        assert copy.data_ptr() % 512 == tensor.data_ptr() % 512
        assert copy.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()


def test_gradients_inference_mode_and_kv_caches_form_the_weights_during_the_pass() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).train()
    x = torch.randn(1, 5, 16)
    _, cache = module.run_with_cache(x)  # parameters that want gradients: formed now
    assert cache.unread() == [] and cache["attn.pattern"].requires_grad
    with torch.inference_mode():  # inference tensors keep no version counter to check
        _, cache = module.eval().run_with_cache(x)
    assert cache.unread() == [] and torch.equal(
        cache["attn.pattern"], formed_during_the_pass(module, x)["attn.pattern"]
    )
    attention = ATTENTIONS["grouped queries"]().eval()
    wrapped = OneAttention(attention)
    kv_cache = KVCache()
    with torch.no_grad(), wrapped.hook_session(names_filter=None) as cache:
        attention(x[:, :4], causal=True, kv_cache=kv_cache)
        attention(x[:, 4:], causal=True, kv_cache=kv_cache)
    # The cache's buffers are written by later steps: the last step's pattern is kept as formed
    # (and its one position's per-head result too: smaller than the weight copy a read needs).
    assert cache.unread() == [] and cache["attn.pattern"].shape == (1, 4, 1, 5)


@pytest.mark.parametrize("positions", [3, 4, 5])
def test_a_per_head_result_no_larger_than_the_weight_copy_is_formed_in_the_pass(positions) -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()  # head dim 4
    x = torch.randn(1, positions, 16)
    _, cache = cached_without_hooks(module, x)
    assert ("attn.result" in cache.unread()) == (positions > 4)
    assert torch.equal(cache["attn.result"], formed_during_the_pass(module, x)["attn.result"])


def test_cross_attention_of_an_encoder_decoder_defers_and_reads_back_exactly() -> None:
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(16, 2, 32, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0)).eval()
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    _, cache = cached_without_hooks(model, src, tgt)
    assert "decoder.layers.0.cross_attn.pattern" in cache.unread()
    formed = formed_during_the_pass(model, src, tgt)
    assert all(torch.equal(cache[name], formed[name]) for name in formed)


def test_caches_of_the_same_weights_share_one_copy_of_them() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["additive score"]()).eval()
    x = torch.randn(1, 9, 16)

    def kept(cache) -> list[torch.Tensor]:  # the copies the cache's unread entries hold
        result, pattern = cache._entries["attn.result"].deferred, cache._entries["attn.pattern"].deferred
        return [result.copies["output_weight"], *pattern.compute.keywords["options"].score.parameters()]

    _, first = cached_without_hooks(module, x)
    _, second = cached_without_hooks(module, x)
    assert all(a is b for a, b in zip(kept(first), kept(second), strict=True))
    module.attn.out_proj.weight.data[0, 0] += 1.0
    _, third = cached_without_hooks(module, x)
    assert kept(third)[0] is not kept(first)[0] and kept(third)[1] is kept(first)[1]
    assert torch.equal(third["attn.result"], formed_during_the_pass(module, x)["attn.result"])
    assert not torch.equal(first["attn.result"], third["attn.result"])


def test_the_old_name_of_add_computed_on_read_still_adds_with_a_warning() -> None:
    torch.manual_seed(0)
    module = OneAttention(ATTENTIONS["grouped queries"]()).eval()
    _, cache = cached_without_hooks(module, torch.randn(1, 5, 16))
    deferred = DeferredActivations(lambda values: (2 * values,), {"values": torch.ones(2)}, what="doubled ones")
    with pytest.warns(
        DeprecationWarning, match=r"ActivationCache\.record_on_read is now ActivationCache\.add_computed_on_read"
    ):
        cache.record_on_read({"doubled": 0}, deferred)
    assert "doubled" in cache.unread()
    assert torch.equal(cache["doubled"], torch.full((2,), 2.0))
