"""Memory checked before it is allocated (attnkit.models.checkpoints.memory): the weights at load, the
attention maps, cached activations and logits of a run, a generation's KV cache, each
against the memory available (faked here with ``ATTNKIT_MEMORY_LIMIT`` or a patched reader
of ``/proc/meminfo`` and the cgroup files)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from attnkit import models
from attnkit.models.checkpoints import memory
from tests.fixtures.crafted import tokenizer_json

transformers = pytest.importorskip("transformers")

# TinyLlama-1.1B's shape.
ONE_B = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def one_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1.1B-parameter LLaMA folder whose weights file holds a real safetensors header and
    no data (a sparse file of the full size: nothing is written or readable)."""
    folder = tmp_path_factory.mktemp("one-b")
    config = transformers.LlamaConfig(**ONE_B, tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = {
            k: list(v.shape) for k, v in transformers.AutoModelForCausalLM.from_config(config).state_dict().items()
        }
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * torch.Size(shape).numel()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        f.truncate(8 + len(encoded) + offset)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **ONE_B}))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    return folder


@pytest.fixture
def no_weight_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading any weight fails the test."""

    def read(*_args, **_kwargs):
        raise AssertionError("a weight was read")

    monkeypatch.setattr("attnkit.models.loading.load_tensors", read)


def test_a_1b_model_over_the_limit_is_refused_before_any_weight_is_read(one_b, no_weight_read, monkeypatch) -> None:
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "3GB")
    with pytest.raises(models.MemoryEstimateError) as caught:
        models.load(one_b)
    message = str(caught.value)
    assert "\n" not in message
    assert (
        "the weights of one-b" in message and "in float32 and its position tables would take about 4.1 GiB" in message
    )
    assert "2.8 GiB of ATTNKIT_MEMORY_LIMIT=3GB" in message and "--dtype bfloat16" in message
    # The parameters, and the float32 rotary tables: cosines and sines of 2,048 positions x
    # head dim 64, with the 32 frequencies and 64 signs they are made from.
    assert caught.value.needed == 4 * 1_100_048_384 + 4 * (2 * 2048 * 64 + 32 + 64)
    # In bfloat16 the weights fit (2.0 GiB): the check passes and the load goes on to read them.
    with pytest.raises(AssertionError, match="a weight was read"):
        models.load(one_b, dtype="bfloat16")


def test_the_command_line_refuses_it_in_one_line(one_b, no_weight_read, monkeypatch, capsys) -> None:
    from attnkit.cli import main

    monkeypatch.setenv(memory.LIMIT_VARIABLE, "3GB")
    assert main(["inspect", "w1 w2", "--model", str(one_b), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would take about 4.1 GiB" in err and "--dtype bfloat16" in err


def test_available_memory_is_the_least_of_ram_the_cgroup_and_the_variable(monkeypatch) -> None:
    files = {
        "/proc/meminfo": "MemTotal:       32000000 kB\nMemAvailable:    8000000 kB\n",
        "/sys/fs/cgroup/memory.max": "6000000000\n",
        "/sys/fs/cgroup/memory.current": "1000000000\n",
    }
    monkeypatch.setattr(memory, "_read", files.get)
    monkeypatch.delenv(memory.LIMIT_VARIABLE, raising=False)
    assert memory.available_memory() == (5_000_000_000, "memory left under this process's cgroup limit")
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert memory.available_memory() == (8_192_000_000, "available RAM (MemAvailable)")
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "1.5GiB")
    assert memory.available_memory() == (3 * 2**29, "ATTNKIT_MEMORY_LIMIT=1.5GiB")
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "lots")
    with pytest.raises(ValueError, match='ATTNKIT_MEMORY_LIMIT must be a size such as "8GB"'):
        memory.available_memory()


@pytest.mark.parametrize("case", ["qwen2", "gemma2", "gpt2", "minilm"])
def test_the_estimate_of_cached_activations_is_what_a_run_keeps(case, tiny_family_folder, minilm) -> None:
    # Grouped keys and values (Qwen 2), heads wider than the model dim (Gemma 2), fused
    # projections (GPT-2), an encoder (MiniLM).
    model = minilm if case == "minilm" else models.load(tiny_family_folder(case))
    text = "the cat sat" if case == "minilm" else "w1 w5 w2 w7 w3 w9"
    s = len(model.tokenize(text))
    for names in (None, lambda n: n.endswith("pattern"), lambda n: "resid" in n or n.endswith((".q", ".k"))):
        _, cache = model.run_with_cache(text, names_filter=names)
        kept = sum(t.numel() * t.element_size() for t in cache.values())
        assert memory.run_bytes(model, [(1, s)], weight_layers=0, names_filter=names, logits=False) == kept


def test_run_with_cache_and_run_get_the_same_estimate_up_front(smollm2, monkeypatch) -> None:
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "1GB")
    text = "hello " * 3000
    with pytest.raises(models.MemoryEstimateError) as cached:
        smollm2.run_with_cache(text)
    with pytest.raises(models.MemoryEstimateError) as ran:
        smollm2.run(text, return_weights=False, names_filter=None)
    assert cached.value.needed == ran.value.needed > 2 * 30 * 9 * 3001**2 * 4  # scores and pattern alone
    assert "\n" not in str(ran.value) and "of smollm2 on 3001 tokens would take about" in str(ran.value)
    with pytest.raises(models.MemoryEstimateError, match="on 2 inputs would take"):
        smollm2.run_batch([text, text], return_weights=False, names_filter=lambda n: n.endswith("pattern"))


def test_a_generation_whose_kv_cache_does_not_fit_is_refused_at_the_call(smollm2, monkeypatch) -> None:
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "100MB")
    # 30 layers × 3 key/value heads × 64 dims × 2 (keys, values) × 4 bytes = 46 kB a token.
    with pytest.raises(models.MemoryEstimateError, match=r"the KV cache of smollm2 for 1 prompt and 8191 new tokens"):
        smollm2.generate_ids("Hi", max_new_tokens=10**9)
    assert len(list(smollm2.generate_ids("Hi", max_new_tokens=2))) <= 2


def test_a_source_and_target_pass_is_checked_too(tiny_t5, monkeypatch) -> None:
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "1KB")
    with pytest.raises(
        models.MemoryEstimateError,
        match=r"of tiny-t5 on 4 source and 3 target tokens would take about \d+ KiB, more than the 1 KiB",
    ):
        tiny_t5.run_encoder_decoder("the cat sat", "a dog")


def _fake_cuda(monkeypatch, *, free: int, reserved: int, allocated: int) -> None:
    """What ``torch.cuda`` reports on a card that is not there."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 139 * 10**9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_free_cuda_memory_counts_what_the_allocator_holds_unused(monkeypatch) -> None:
    # After earlier work the driver says 1.6 GiB are free, but PyTorch's cache holds 100 GiB
    # of which 10 GiB are in use: a new tensor can have 91.6 GiB.
    monkeypatch.delenv(memory.LIMIT_VARIABLE, raising=False)
    _fake_cuda(monkeypatch, free=int(1.6 * 2**30), reserved=100 * 2**30, allocated=10 * 2**30)
    available, said = memory.available_memory("cuda:0")
    assert available == int(1.6 * 2**30) + 90 * 2**30
    assert said == "free memory on cuda:0 (the driver's free memory and PyTorch's unused cache)"
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "8GiB")
    assert memory.available_memory("cuda:0") == (8 * 2**30, "ATTNKIT_MEMORY_LIMIT=8GiB")


class _OnCuda:
    """A model's sizes (TinyLlama-1.1B's attention), its device read as CUDA."""

    def __init__(self, model) -> None:
        self.module, self.config, self.name = model.module, model.config, "one-b"
        self.num_heads, self.num_kv_heads = 32, 4
        self.device = torch.device("cuda:0")


def test_the_guard_counts_the_heads_and_rows_asked_against_the_card(smollm2, monkeypatch) -> None:
    monkeypatch.delenv(memory.LIMIT_VARIABLE, raising=False)
    model = _OnCuda(smollm2)
    s = 32768
    # One head of one layer: 4 GiB, where every head would be 128 GiB.
    assert memory.attention_bytes(1, 1, [(1, s)]) == 4 * 2**30
    assert memory.run_bytes(model, [(1, s)], weight_layers=1, heads=1, logits=False) == 4 * 2**30
    assert memory.run_bytes(model, [(1, s)], weight_layers=1, heads=1, rows=1024, logits=False) == 2**27
    assert memory.run_bytes(model, [(1, s)], weight_layers=1, logits=False) == 128 * 2**30
    _fake_cuda(monkeypatch, free=int(1.6 * 2**30), reserved=30 * 2**30, allocated=20 * 2**30)
    memory.check_run_memory(model, [(1, s)], weight_layers=1, heads=1, logits=False, on=f"{s} tokens", advice="-")
    with pytest.raises(models.MemoryEstimateError) as refused:
        memory.check_run_memory(
            model, [(1, s)], weight_layers=1, heads=4, logits=False, on=f"{s} tokens", advice=memory.MAP_ADVICE
        )
    message = str(refused.value)
    assert refused.value.needed == 16 * 2**30 and refused.value.available == int(11.6 * 2**30)
    assert (
        "of one-b on 32768 tokens (maps: 1 layer × 4 heads × 32768 rows × 32768 keys × 4 bytes = 16.0 GiB)" in message
    )
    assert "would take about 16.0 GiB, more than the 11.6 GiB of free memory on cuda:0" in message
    for lowers in ("--heads", "--rows", "--layers", "shorter text"):
        assert lowers in message
    # The rows of a slice fit where the whole map does not.
    memory.check_run_memory(
        model, [(1, s)], weight_layers=1, heads=4, rows=8192, logits=False, on=f"{s} tokens", advice="-"
    )


def test_one_head_at_8k_tokens_is_no_longer_refused_by_a_fixed_cap(smollm2, monkeypatch) -> None:
    # Every head of the last layer is 2.25 GiB (refused by the old 2 GiB cap); the head asked
    # is 256 MiB, and that is what the limit is compared with.
    monkeypatch.setenv(memory.LIMIT_VARIABLE, "1GiB")
    memory.check_run_memory(smollm2, [(1, 8192)], weight_layers=1, heads=1, logits=False, on="8192 tokens", advice="-")
    with pytest.raises(
        models.MemoryEstimateError, match=r"1 layer × 9 heads × 8192 rows × 8192 keys × 4 bytes = 2.2 GiB"
    ):
        memory.check_run_memory(smollm2, [(1, 8192)], weight_layers=1, logits=False, on="8192 tokens", advice="-")
