"""Maps of the heads and rows asked for, and no others (attnkit.nn.WeightSelection): in every
family — soft-capping (Gemma 2), sliding windows (Mistral, Qwen 2, Gemma 3), latent attention
and experts (DeepSeek-V3, Mixtral, Qwen-MoE), T5's relative biases, BART's and T5's cross-attention, BERT — the chosen heads' and rows' maps equal those
of a pass that forms every head's weights, every output equals a pass that forms none, and
no unasked head's map is ever formed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import models
from attnkit.nn import StackOutput, WeightSelection
from tests.fixtures.crafted import write_tiny_llama
from tests.fixtures.encoder_decoder_checkpoints import write_bart
from tests.fixtures.tiny_families import CASES, MOE_CASES, TEXT_LENGTH, VOCAB

pytest.importorskip("transformers")


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(3))


def _every_head(model, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s weights of every head, ``[1, h, s, s]``, from a pass that forms them
    all (the reference path: the weights the kernel normalises, not recomputed)."""
    with torch.no_grad():
        out = model.module.last_hidden_state(ids, return_weights=[layer])
    assert isinstance(out, StackOutput)
    return out.weights[layer].self_attention.float()


@pytest.fixture(scope="module", params=sorted(CASES | MOE_CASES))
def family(request, tiny_family_folder) -> models.Model:
    return models.load(tiny_family_folder(request.param))


def test_chosen_heads_and_rows_of_every_decoder_family_equal_every_head_s_map(family) -> None:
    ids = _ids()
    plain = family.run(ids, return_weights=False)
    for layer in range(family.num_layers):  # local and global layers alike
        full = _every_head(family, ids, layer)
        heads = [family.num_heads - 1, 0]
        run = family.run(ids, return_weights=[layer], heads=heads, rows=range(5, 17))
        assert run.heads == heads and run.rows == range(5, 17)
        got = run.attentions[layer]
        assert got.shape == (1, 2, 12, TEXT_LENGTH) and got.dtype == torch.float32
        torch.testing.assert_close(got, full[:, heads, 5:17], rtol=0, atol=2e-6)
        # Every head's output is the fused kernel's, as in a pass without weights.
        assert torch.equal(run.last_hidden_state, plain.last_hidden_state)
        assert torch.equal(run.logits, plain.logits)


def test_every_head_and_row_by_default_equals_the_full_map(family) -> None:
    ids = _ids()
    run = family.run(ids, return_weights=[-1])
    assert run.rows == range(TEXT_LENGTH)
    torch.testing.assert_close(run.attentions[-1], _every_head(family, ids, family.num_layers - 1), rtol=0, atol=2e-6)


def test_a_slice_of_rows_counts_from_the_end_and_rows_past_the_text_are_refused(tiny_family_folder) -> None:
    model = models.load(tiny_family_folder("gemma2"))  # soft-capping and windows
    ids = _ids()
    run = model.run(ids, return_weights=[0], heads=[1], rows=slice(-3, None))
    assert run.rows == range(TEXT_LENGTH - 3, TEXT_LENGTH)
    torch.testing.assert_close(run.attentions[0], _every_head(model, ids, 0)[:, [1], -3:], rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match=rf"rows 18..20 are out of range: the input has {TEXT_LENGTH} tokens"):
        model.run(ids, rows=range(18, 21))
    with pytest.raises(ValueError, match="step 1"):
        model.run(ids, rows=slice(0, 10, 2))


def test_bert_chosen_heads_and_rows(minilm) -> None:
    text = "the cat sat on the mat because it was warm"
    ids = minilm.tokenize(text).ids
    full = _every_head(minilm, ids, 3)
    run = minilm.run(text, return_weights=[3], heads=[7, 2], rows=range(1, 4))
    torch.testing.assert_close(run.attentions[3], full[:, [7, 2], 1:4], rtol=0, atol=2e-6)
    assert torch.equal(run.last_hidden_state, minilm.run(text, return_weights=False).last_hidden_state)


@pytest.fixture(scope="module")
def bart(tmp_path_factory: pytest.TempPathFactory) -> models.Model:
    folder = tmp_path_factory.mktemp("chosen-bart") / "bart"
    return models.load(write_bart(folder, d_model=42, encoder_attention_heads=3, decoder_attention_heads=7))


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_each_kind_of_an_encoder_decoder_forms_its_own_chosen_heads(name, tiny_t5, bart) -> None:
    # T5: relative position biases in both stacks; BART: other head counts per stack.
    model = tiny_t5 if name == "t5" else bart
    source, target = "the cat sat on the mat", "a dog ran"
    full = model.run_encoder_decoder(source, target)
    heads = {"encoder": [1], "decoder": [2, 0], "cross": [0]}
    chosen = model.run_encoder_decoder(source, target, heads=heads)
    assert chosen.heads == heads
    for kind in ("encoder", "decoder", "cross"):
        for layer, weights in chosen.attentions(kind).items():
            torch.testing.assert_close(weights, full.attentions(kind)[layer][:, heads[kind]], rtol=0, atol=2e-6)
    assert torch.equal(chosen.logits, model.run_encoder_decoder(source, target, heads=[0]).logits)


def test_a_decoder_layer_forms_the_chosen_rows_of_its_self_and_cross_attention(tiny_t5) -> None:
    module = tiny_t5.module
    source = torch.tensor([[5, 6, 7, 8, 9, 10, 1]])
    target = torch.tensor([[0, 11, 12, 13, 14, 15]])
    asked = WeightSelection(heads=(1,), rows=range(2, 5), cross_heads=(3, 0))
    with torch.no_grad():
        memory = module.encode(source)
        plain = module.decode(target, memory)
        full = module.decode(target, memory, return_weights=[1])
        chosen = module.decode(target, memory, return_weights={1: asked})
    assert torch.equal(plain, chosen.output)
    want = full.weights[1]
    got = chosen.weights[1]
    torch.testing.assert_close(got.self_attention, want.self_attention[:, [1], 2:5].float(), rtol=0, atol=2e-6)
    torch.testing.assert_close(got.cross_attention, want.cross_attention[:, [3, 0], 2:5].float(), rtol=0, atol=2e-6)
    with pytest.raises(TypeError, match="WeightSelection"):
        module.decode(target, memory, return_weights={1: [0]})


def test_run_batch_forms_the_chosen_rows_of_each_input_padded_either_side(tmp_path: Path) -> None:
    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    texts = ["the cat sat on the mat", "a dog", "the dog sat"]
    for side in ("right", "left"):
        runs = model.run_batch(texts, return_weights=[1], heads=[1], rows=slice(-2, None), padding_side=side)
        for text, run in zip(texts, runs):
            alone = model.run(text, return_weights=[1], heads=[1])
            n = len(run.tokens)
            assert run.rows == range(n - 2, n)
            torch.testing.assert_close(run.attentions[1], alone.attentions[1][:, :, -2:], rtol=0, atol=1e-5)


def test_a_hook_on_the_pattern_sees_every_head_and_the_run_keeps_the_chosen_ones(tmp_path: Path) -> None:
    model = models.load(write_tiny_llama(tmp_path / "tiny"))
    seen = []
    with model.hooks({model.hook_name("self_attn.pattern", 1): lambda t: seen.append(t.shape) or t}):
        run = model.run("the cat sat on the mat", return_weights=[1], heads=[0], rows=range(1, 3))
    assert seen[0][1] == model.num_heads
    full = model.run("the cat sat on the mat", return_weights=[1])
    torch.testing.assert_close(run.attentions[1], full.attentions[1][:, [0], 1:3], rtol=0, atol=1e-6)


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an operation produces."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("case", ["llama_llama3", "qwen2", "mistral", "gpt2", "qwen3"])
def test_no_map_of_a_head_not_asked_for_is_ever_formed(case, tiny_family_folder) -> None:
    model = models.load(tiny_family_folder(case))
    ids = _ids()
    s = TEXT_LENGTH
    with _Shapes() as plain:
        model.run(ids, return_weights=False, logits=False)
    with _Shapes() as watched:
        run = model.run(ids, return_weights=True, heads=[2], rows=range(4, 9), logits=False)
    assert all(run.attentions[i].shape == (1, 1, 5, s) for i in range(model.num_layers))
    # Beyond what a pass without weights computes (the fused kernel's blocks and masks),
    # every tensor over (query, key) pairs holds the chosen rows of one head at most.
    extra = _over_pairs(watched.shapes, s)
    for shape in _over_pairs(plain.shapes, s):
        extra.remove(shape)
    assert (1, 1, 5, s) in extra, "the chosen head's map is formed"
    d = model.module.self_attention(0).head_dim  # keys transposed, [b, heads, d, s], are no pairs
    assert all(shape[1] * shape[2] <= 5 for shape in extra if shape[2] != d), extra
    # Without the selection the same pass forms every head's weights: the check can fail.
    with _Shapes() as every:
        model.module.last_hidden_state(ids, return_weights=[0])
    assert (1, model.num_heads, s, s) in _over_pairs(every.shapes, s)


def _over_pairs(shapes: list[tuple[str, tuple[int, ...]]], s: int) -> list[tuple[int, ...]]:
    """The shapes ``[b, heads, rows, s]`` of the tensors over (query, key) pairs."""
    return [shape for _, shape in shapes if len(shape) == 4 and shape[-1] == s]
