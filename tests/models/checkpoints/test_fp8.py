"""Block-quantized fp8 checkpoints (DeepSeek-V3's format): a tiny DeepSeek-V3 checkpoint
quantized here loads dequantized and equals the same weights saved dequantized; other
quantizations and inconsistent scales are refused in one line; the memory check counts
the dequantized weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from attnkit import models
from attnkit.models import CheckpointError
from attnkit.models.checkpoints.memory import weight_bytes
from attnkit.models.checkpoints.quantization import BlockQuantization, dequantized_headers
from attnkit.models.checkpoints.weights import read_headers

safetensors_torch = pytest.importorskip("safetensors.torch")
BLOCK = [16, 8]  # small blocks: the tiny matrices hold several, with partial ones at the edges


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 values, float32 scales [⌈rows/16⌉, ⌈cols/8⌉])`` with ``weight ≈ values · scale``."""
    rows, cols = weight.shape
    br, bc = BLOCK
    scale = torch.empty((rows + br - 1) // br, (cols + bc - 1) // bc)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = weight[i * br : (i + 1) * br, j * bc : (j + 1) * bc]
            scale[i, j] = block.abs().max().clamp(min=1e-12) / 448.0
    full = scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    return (weight / full).to(torch.float8_e4m3fn), scale


@pytest.fixture(scope="module")
def quantized_pair(tiny_family_folder, tmp_path_factory) -> tuple[Path, Path]:
    """``(fp8 checkpoint, the same weights dequantized in float32)``, from the tiny
    DeepSeek-V3 checkpoint: every projection of attention and experts quantized, as
    DeepSeek-V3 ships them (embeddings, norms, router and head stay as they are)."""
    source = tiny_family_folder("deepseek_v3")
    root = tmp_path_factory.mktemp("fp8")
    fp8, reference = root / "fp8", root / "reference"
    for folder in (fp8, reference):
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors*"))
    tensors = {}
    for path in sorted(source.glob("*.safetensors")):
        tensors |= safetensors_torch.load_file(path)
    quantized, dequantized = {}, {}
    for key, value in tensors.items():
        if key.endswith("proj.weight") and "layers." in key:
            values, scale = _quantize(value)
            quantized |= {key: values, key + "_scale_inv": scale}
            full = scale.repeat_interleave(BLOCK[0], 0)[: value.shape[0]].repeat_interleave(BLOCK[1], 1)
            dequantized[key] = values.float() * full[:, : value.shape[1]]
        else:
            quantized[key] = dequantized[key] = value
    safetensors_torch.save_file(quantized, fp8 / "model.safetensors")
    safetensors_torch.save_file(dequantized, reference / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": BLOCK,
    }
    (fp8 / "config.json").write_text(json.dumps(config))
    return fp8, reference


def test_an_fp8_checkpoint_equals_its_dequantized_reference(quantized_pair) -> None:
    fp8, reference = quantized_pair
    assert any(dtype == "F8_E4M3" for _, dtype, _ in read_headers([fp8 / "model.safetensors"]).values())
    model, expected = models.load(fp8), models.load(reference)
    for (name, ours), (_, theirs) in zip(model.module.state_dict().items(), expected.module.state_dict().items()):
        assert torch.equal(ours, theirs), name
    text = "w3 w17 w5 w99 w42"
    torch.testing.assert_close(model.run(text).logits, expected.run(text).logits, rtol=0, atol=1e-5)
    in_bf16 = models.load(fp8, dtype="bfloat16")
    weight = "decoder.layers.1.self_attn.kv_b_proj.weight"
    assert torch.equal(in_bf16.module.state_dict()[weight], expected.module.state_dict()[weight].bfloat16())


def test_the_memory_estimate_counts_the_dequantized_weights(quantized_pair) -> None:
    fp8, reference = quantized_pair
    stored = read_headers([fp8 / "model.safetensors"])
    loaded = dequantized_headers(stored, BlockQuantization(tuple(BLOCK)))
    plain = read_headers([reference / "model.safetensors"])
    assert weight_bytes(loaded, torch.bfloat16) == weight_bytes(plain, torch.bfloat16)
    # fp8 takes one byte a value on disk, two once dequantized to bfloat16.
    assert weight_bytes(loaded, torch.bfloat16) > weight_bytes(stored, torch.bfloat16)


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not supported; attnkit reads fp8"),
        ({"quant_method": "fp8", "weight_block_size": [16]}, "weight_block_size must be two block sizes"),
        ({"quant_method": "fp8", "weight_block_size": [32, 8]}, r"_scale_inv is \[\d+, \d+\], expected"),
        (None, "is fp8, but config.json has no quantization_config"),
    ],
)
def test_unknown_or_inconsistent_quantization_is_refused_in_one_line(quantized_pair, tmp_path, quantization, message):
    fp8, _ = quantized_pair
    folder = Path(shutil.copytree(fp8, tmp_path / "changed"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as caught:
        models.load(folder)
    assert "\n" not in str(caught.value)
