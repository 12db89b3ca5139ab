"""DecoderLM: cached decoding equals recomputation, generation, tied weights, errors."""

from __future__ import annotations

import pytest
import torch

from attnkit.nn import DecoderLM, DecoderLMConfig, LMOutput, RotaryEmbedding
from attnkit.nn.lm import pick_next_token
from tests.nn.helpers import assert_close

V, E, H = 23, 16, 4


def _tiny(**kwargs) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(DecoderLMConfig(E, H, 32, vocab_size=V, num_layers=2, **kwargs)).eval()


LLAMA_LIKE = dict(positional="rotary", num_kv_heads=2, rope_theta=1e5, activation="swiglu", norm="rms", bias=False)


@pytest.mark.parametrize(
    "options",
    [
        dict(positional="learned"),
        dict(positional="sinusoidal"),
        dict(positional="alibi"),
        LLAMA_LIKE,
        dict(positional="none", norm_first=False),
    ],
    ids=["learned", "sinusoidal", "alibi", "llama", "none-postnorm"],
)
def test_cached_logits_equal_full_recomputation(options: dict) -> None:
    model = _tiny(**options)
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    full = model(tokens)
    cache = model.new_kv_cache()
    steps = [model(tokens[:, :4], kv_cache=cache)] + [model(tokens[:, i : i + 1], kv_cache=cache) for i in range(4, 9)]
    assert len(cache) == 9
    assert_close(torch.cat(steps, dim=1), full)


def test_llama_configuration_shares_one_rotary_module() -> None:
    model = _tiny(**LLAMA_LIKE)
    ropes = {id(m) for m in model.modules() if isinstance(m, RotaryEmbedding)}
    assert len(ropes) == 1
    attn = model.decoder.layers[0].self_attn
    assert attn.num_kv_heads == 2 and attn.q_proj.bias is None
    assert model.lm_head.weight is model.token_embedding.weight
    assert not any("inv_freq" in name for name in model.state_dict())


def _greedy_by_recomputation(model: DecoderLM, tokens: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        next_token = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat((tokens, next_token), dim=1)
    return tokens


@pytest.mark.parametrize("options", [dict(positional="learned"), LLAMA_LIKE], ids=["learned", "llama"])
def test_greedy_generation_equals_recomputation(options: dict) -> None:
    model = _tiny(**options)
    prompt = torch.randint(0, V, (3, 4), generator=torch.Generator().manual_seed(2))
    generated = model.generate(prompt, 8)
    assert generated.shape == (3, 12)
    assert torch.equal(generated[:, :4], prompt)
    with torch.no_grad():
        assert torch.equal(generated, _greedy_by_recomputation(model, prompt, 8))


def test_sampling_is_reproducible_and_respects_top_k() -> None:
    model = _tiny()
    prompt = torch.zeros(4, 1, dtype=torch.long)
    first = model.generate(prompt, 6, temperature=1.0, generator=torch.Generator().manual_seed(3))
    again = model.generate(prompt, 6, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, again)
    top1 = model.generate(prompt, 6, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(4))
    assert torch.equal(top1, model.generate(prompt, 6))


@pytest.mark.parametrize(
    ("top_p", "top_k", "nucleus"), [(0.7, None, {0, 1}), (0.85, None, {0, 1, 2}), (0.9, 2, {0, 1})]
)
def test_top_p_samples_only_the_nucleus(top_p, top_k, nucleus) -> None:
    # The fewest most likely tokens whose probabilities add up to top_p (of the top_k, with top_k).
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(4000, 4)
    drawn = pick_next_token(
        logits, temperature=1.0, top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(0)
    )
    assert set(drawn.tolist()) == nucleus


def test_generation_stops_at_eos_and_restores_training_mode() -> None:
    model = _tiny(dropout=0.1).train()
    prompt = torch.randint(0, V, (2, 3), generator=torch.Generator().manual_seed(5))
    greedy = model.generate(prompt, 5)
    assert model.training  # restored after generating in eval mode
    eos = int(greedy[0, 3])  # the first token row 0 generates
    stopped = model.generate(prompt, 5, eos_token_id=eos)
    assert torch.all(stopped[0, 3:] == eos)
    assert stopped.shape[1] <= greedy.shape[1]


def test_return_weights() -> None:
    model = _tiny(**LLAMA_LIKE)
    tokens = torch.randint(0, V, (2, 5))
    result = model(tokens, return_weights=True)
    assert isinstance(result, LMOutput) and len(result.weights) == 2
    assert_close(result.logits, model(tokens))
    assert result.weights[0].self_attention.shape == (2, H, 5, 5) and result.weights[0].cross_attention is None


def test_errors() -> None:
    with pytest.raises(ValueError, match="positional must be one of"):
        DecoderLM(DecoderLMConfig(E, H, 32, vocab_size=V, num_layers=1, positional="relative"))
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        DecoderLM(DecoderLMConfig(18, 4, 32, vocab_size=V, num_layers=1))
    model = _tiny(max_length=8)
    with pytest.raises(TypeError, match="integer ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"tokens must be \[b, s\]"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions must be in \[0, 8\)"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 1, temperature=-1.0)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got nan"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 1, temperature=float("nan"))


def test_weights_of_chosen_layers_only() -> None:
    model = _tiny(**LLAMA_LIKE)
    tokens = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(6))
    everything = model(tokens, return_weights=True)
    chosen = model(tokens, return_weights=[1])
    assert isinstance(chosen, LMOutput) and chosen.weights[0] is None
    assert_close(chosen.weights[1].self_attention, everything.weights[1].self_attention)
    assert_close(chosen.logits, everything.logits)
    none_asked = model(tokens, return_weights=[])
    assert isinstance(none_asked, LMOutput) and none_asked.weights == [None, None]
    with pytest.raises(
        ValueError, match=r"layer 2 is out of range: the stack has 2 layers, 0\.\.1 \(or -2\.\.-1 from the end\)"
    ):
        model(tokens, return_weights=[2])
    with pytest.raises(TypeError, match="layer indices must be ints"):
        model(tokens, return_weights=[True])


def test_hidden_states_are_what_the_head_reads() -> None:
    model = _tiny(**LLAMA_LIKE)
    tokens = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(7))
    hidden = model.last_hidden_state(tokens)
    assert hidden.shape == (2, 5, E)
    assert_close(model.lm_head(hidden), model(tokens))
    record = model.last_hidden_state(tokens, return_weights=[0])
    assert_close(record.output, hidden)
    assert record.weights[1] is None


def test_preallocated_cache_equals_growing_cache() -> None:
    model = _tiny(**LLAMA_LIKE)
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_kv_cache(capacity=9)
        steps = [model(tokens[:, :4], kv_cache=cache)] + [
            model(tokens[:, i : i + 1], kv_cache=cache) for i in range(4, 9)
        ]
        assert_close(torch.cat(steps, dim=1), full)
        layer_cache = cache.self_attention[0]
        assert len(layer_cache) == 9 and layer_cache.keys.shape == (2, 2, 9, E // H)
        assert "capacity=9" in repr(layer_cache)
        with pytest.raises(ValueError, match="10 positions overflow this cache's capacity of 9"):
            model(tokens[:, :1], kv_cache=cache)
    with pytest.raises(ValueError, match="preallocated KVCache is for inference"):
        model(tokens, kv_cache=model.new_kv_cache(capacity=9))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        model.new_kv_cache(capacity=0)
