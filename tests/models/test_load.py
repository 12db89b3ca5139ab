"""attnkit.models.load: names, folders, and every way a checkpoint can be wrong."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnkit import models
from attnkit.models.checkpoints.registry import MANIFEST
from attnkit.models.checkpoints.weights import check_safetensors
from attnkit.nn import RotaryEmbedding

SMALL_FILES = ("config.json", "tokenizer.json")


def _copy_minilm(minilm_path: Path, dest: Path, *, weights: bool = True, manifest: bool = False) -> Path:
    dest.mkdir()
    names = [*SMALL_FILES, *(["model.safetensors"] if weights else [])]
    if manifest:  # the manifest lists every file of the folder
        names = [p.name for p in minilm_path.iterdir()]
    for name in names:
        shutil.copy2(minilm_path / name, dest / name)
    return dest


def test_unknown_name_says_what_exists():
    expected = r"no model named 'gpt-9'.*smollm2, minilm.*attnkit models fetch NAME"
    with pytest.raises(models.ModelNotFound, match=expected):
        models.load("gpt-9")
    assert issubclass(models.ModelNotFound, FileNotFoundError)


def test_missing_model_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_HOME", str(tmp_path))
    assert models.home() == tmp_path
    assert models.available() == []
    with pytest.raises(models.ModelNotFound, match=r"run `attnkit models fetch smollm2` first"):
        models.load("smollm2")


def test_a_folder_loads_like_the_named_model(minilm_path, tmp_path, minilm):
    folder = _copy_minilm(minilm_path, tmp_path / "my-minilm")
    copy = models.load(folder)
    assert copy.name == "my-minilm" and copy.family == "bert" and not copy.causal
    assert (copy.num_layers, copy.num_heads, copy.num_kv_heads, copy.max_length) == (6, 12, 12, 512)
    text = "same weights, same output"
    assert torch.equal(copy.run(text).last_hidden_state, minilm.run(text).last_hidden_state)


def test_loading_takes_the_weights_without_copying_or_initialising(smollm2):
    module = smollm2.module
    assert module.lm_head.weight is module.token_embedding.weight  # tied again after assignment
    assert not module.training
    parameters = sum(p.numel() for p in module.parameters())
    assert parameters == 134_515_008  # SmolLM2-135M, the tied head counted once
    assert smollm2.device == torch.device("cpu")
    # Built on the meta device; the computed buffers (rotary frequencies and tables) are
    # computed again on the CPU, equal to a freshly built module's.
    assert not any(t.is_meta for t in [*module.parameters(), *module.buffers()])
    rotary = module.decoder.layers[0].self_attn.positional
    fresh = RotaryEmbedding(rotary.head_dim, theta=rotary.theta, max_positions=rotary.max_positions)
    for name, buffer in fresh.named_buffers():
        assert torch.equal(getattr(rotary, name), buffer), name


def test_loading_builds_the_module_once(minilm_path, monkeypatch):
    """The weights are checked against the very module they are then loaded into: one build
    on the meta device, not one for the check and another for the weights."""
    import dataclasses

    from attnkit.models.families.table import FAMILIES

    family = FAMILIES["bert"]
    builds = []
    counted = dataclasses.replace(family, build=lambda config: builds.append(config) or family.build(config))
    monkeypatch.setitem(FAMILIES, "bert", counted)
    model = models.load(minilm_path)
    assert len(builds) == 1
    assert not any(t.is_meta for t in model.module.parameters())


def test_dtype_and_device_options(minilm_path, tmp_path):
    half = models.load(_copy_minilm(minilm_path, tmp_path / "m"), dtype=torch.bfloat16)
    assert half.module.token_embedding.weight.dtype == torch.bfloat16
    run = half.run("low precision still runs", return_weights=[0])
    assert run.last_hidden_state.dtype == torch.float32 and run.attentions[0].dtype == torch.float32
    with pytest.raises(TypeError, match="one of those torch dtypes, got torch.int8"):
        models.load(tmp_path / "m", dtype=torch.int8)


def test_truncated_safetensors_is_a_clear_error(minilm_path, tmp_path):
    folder = _copy_minilm(minilm_path, tmp_path / "cut", weights=False)
    data = (minilm_path / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    expected = r"model.safetensors is truncated: its tensors need 90868376 bytes, the file has 45434188"
    with pytest.raises(ValueError, match=expected):
        models.load(folder)
    (folder / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(ValueError, match="truncated or not a safetensors file"):
        models.load(folder)


def test_corrupt_safetensors_is_a_clear_error(minilm_path, tmp_path):
    folder = _copy_minilm(minilm_path, tmp_path / "bad", weights=False)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ValueError, match="header is not valid JSON"):
        models.load(folder)
    path = tmp_path / "odd.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(2, 2)}, path)
    assert set(check_safetensors(path)) == {"a", "b"}
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    header["a"]["shape"] = [5]  # 5 floats in a 16-byte range
    text = json.dumps(header, separators=(",", ":")).encode().ljust(header_len)
    path.write_bytes(bytes(raw[:8]) + text + bytes(raw[8 + header_len :]))
    with pytest.raises(ValueError, match=r"tensor 'a' \(F32 \[5\]\) has byte range"):
        check_safetensors(path)


def test_changed_file_of_a_fetched_model_fails_its_hash(minilm_path, tmp_path):
    folder = _copy_minilm(minilm_path, tmp_path / "m", manifest=True)
    models.load(folder)  # copy2 keeps the modification times: nothing needs re-hashing
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["sha256"].startswith("53aa5117")
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # same size, same valid header, one flipped byte in the last tensor
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256 differs from the one recorded at fetch time"):
        models.load(folder)
    (folder / "model.safetensors").write_bytes(bytes(data[:-10]))
    with pytest.raises(ValueError, match="is truncated or changed: 90868366 bytes, expected 90868376"):
        models.load(folder)


def test_unsupported_or_inconsistent_checkpoints(minilm_path, tmp_path):
    folder = _copy_minilm(minilm_path, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())

    def write(**changes):
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    write(model_type="falcon")
    # falcon computes attention outside transformers' attention interface: not bridged either.
    expected = (
        r"model_type 'falcon' is not supported: its transformers code computes attention without transformers' "
        r"attention interface, .*attnkit loads llama, bert, gpt2, .*through the bridge.*capture"
    )
    with pytest.raises(ValueError, match=expected):
        models.load(folder)
    write(hidden_act="relu")
    with pytest.raises(models.CheckpointError, match="config.json: hidden_act='relu' is not supported"):
        models.load(folder)
    write(num_hidden_layers=7)
    with pytest.raises(models.CheckpointError, match="num_hidden_layers is 7, but the weights hold 6 layers"):
        models.load(folder)
    write(vocab_size=30000)
    expected = r"model.safetensors: weights of the wrong shape .*word_embeddings.weight is \[30522, 384\], expected"
    with pytest.raises(models.CheckpointError, match=expected):
        models.load(folder)
    write(intermediate_size=1024)
    expected = r"weights of the wrong shape .*intermediate.dense.weight is \[1536, 384\], expected \[1024, 384\]"
    with pytest.raises(ValueError, match=expected):
        models.load(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        models.load(folder)
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match="has no config.json"):
        models.load(folder)


def test_llama_config_checks():
    from attnkit.models.families.llama import read_config
    from attnkit.nn.rope_scaling import Llama3RopeScaling, YarnRopeScaling

    base = {
        "vocab_size": 10,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "rope_theta": 500.0,
        "eos_token_id": [3, 4],
    }
    config = read_config(base)
    assert config.ropes[0].theta == 500.0 and config.num_kv_heads == 2 and config.eos_token_ids == (3, 4)
    transformers5 = {**base, "rope_parameters": {"rope_theta": 1e5, "rope_type": "default"}}
    assert read_config(transformers5).ropes[0].theta == 1e5
    llama3 = read_config({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}).ropes[0].scaling
    assert llama3 == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)
    with pytest.raises(ValueError, match="rope_type='yarn' is not supported"):
        read_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}})
    # DeepSeek-V3's YaRN (mscale = mscale_all_dim: no scaling of the rotated vectors) is read.
    deepseek_yarn = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}
    deepseek_yarn |= {"mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    yarn = read_config({**base, "rope_scaling": deepseek_yarn}).ropes[0].scaling
    assert yarn == YarnRopeScaling(40.0, 4096)
    with pytest.raises(ValueError, match="rope_scaling: factor must be >= 1"):
        read_config({**base, "rope_scaling": {"rope_type": "linear", "factor": 0.5}})
    assert read_config({**base, "attention_bias": True}).qkv_bias
    with pytest.raises(ValueError, match="intermediate_size is missing"):
        read_config({k: v for k, v in base.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match=r"hidden_act='gelu' is not supported \(attnkit has 'silu'\)"):
        read_config({**base, "hidden_act": "gelu"})


def test_pickled_weights_are_refused(minilm_path, tmp_path):
    folder = _copy_minilm(minilm_path, tmp_path / "m", weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="pickled weights are never loaded"):
        models.load(folder)
    with pytest.raises(ValueError, match="is a file"):
        models.load(folder / "config.json")


def test_loading_imports_neither_the_compiler_nor_transformers_nor_matplotlib(smollm2_path, minilm_path):
    # Building on the meta device computes nothing: torch's meta kernels for arithmetic and
    # random fills would import torch._dynamo (seconds), which loading does not need.
    script = (
        "import sys; from attnkit import models\n"
        f"models.load({str(smollm2_path)!r}); models.load({str(minilm_path)!r})\n"
        "print(sorted(m for m in ('torch._dynamo', 'transformers', 'matplotlib') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_module_built_on_meta_computes_its_buffers_when_materialized():
    from attnkit.models.families.meta_device import build_without_weights, materialize_buffers

    built = build_without_weights(lambda: RotaryEmbedding(8, theta=100.0, max_positions=16))
    assert all(b.is_meta for b in built.buffers())
    materialize_buffers(built)
    reference = RotaryEmbedding(8, theta=100.0, max_positions=16)
    assert [(n, b.device.type) for n, b in built.named_buffers()] == [(n, "cpu") for n, _ in reference.named_buffers()]
    for (name, ours), (_, theirs) in zip(built.named_buffers(), reference.named_buffers()):
        assert torch.equal(ours, theirs), name
