"""attnkit on a GPU: masked, local and sparse attention against FlexAttention given a
hand-written ``mask_mod`` for the same pattern and against SDPA with a dense bool mask; causal
linear attention against SDPA ``is_causal`` and flash-linear-attention (fla-core, when it is
installed), with the memory bandwidth it achieves.

    python benchmarks/bench_gpu.py            # timings, results/gpu.* and results/gpu_linear.*
    python benchmarks/bench_gpu.py --check    # also: every kernel on CUDA vs float64 CPU
    python benchmarks/bench_gpu.py --only linear --check   # linear attention alone (a few minutes)
    python benchmarks/bench_gpu.py --only local   # local_attention vs FlexAttention, alternating
    python benchmarks/bench_gpu.py --quick --device cpu   # a small dry run of the script

Every contender of a row runs in the same process on the same inputs; times are medians of
batches of calls between two synchronisations, after a warm-up that compiles. Compile time
(the first call of a new mask and shape, block mask included) is reported apart, as are the
block-mask build times. ``--check`` compares outputs (and gradients, and the log-sum-exp) on
CUDA with attnkit's dense reference engine in float64 on the CPU: relative error
``max|got - ref| / max|ref|``, within 1e-5 for float32 and 2e-2 for bfloat16.

Without a GPU (and without ``--device cpu``) it prints that it did not run and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from benchmarks.common import benchmark_parser  # noqa: E402

# Sequence lengths of the causal linear attention rows.
LINEAR_LENGTHS = "16384,65536,262144"


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--check", action="store_true", help="compare every kernel on the device with float64 on the CPU"
    )
    parser.add_argument("--quick", action="store_true", help="small shapes (a dry run)")
    parser.add_argument("--device", default="cuda", help="device to run on (default cuda)")
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32")
    parser.add_argument(
        "--only",
        choices=("masked", "linear", "local"),
        default=None,
        help="run only the masked, local and sparse rows (results gpu.*), only causal linear attention "
        "(results gpu_linear.*) or only local attention against FlexAttention, timed in alternation "
        "(results gpu_local.*); default the first two",
    )
    parser.add_argument(
        "--lengths",
        default=None,
        help=f"comma-separated sequence lengths of the linear rows (default {LINEAR_LENGTHS}; 1024 with --quick)",
    )
    parser.add_argument(
        "--linear-engine",
        default="auto",
        choices=("auto", "eager", "compiled", "triton"),
        help="engine of attnkit's linear_attention in the linear rows and checks (default auto: triton on CUDA)",
    )
    parser.add_argument(
        "--no-compiled-engine",
        action="store_true",
        help="leave attnkit's compiled engine out of the linear rows (its torch.compile takes a minute)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write gpu.{json,md} and gpu_linear.{json,md} here instead of benchmarks/results",
    )
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; rows left when it runs out are skipped")
    return parser


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import torch  # noqa: E402

import attnkit  # noqa: E402
from attnkit import masks  # noqa: E402
from attnkit.functional import flex  # noqa: E402
from benchmarks.common import attention_flops, environment, markdown_table, write_results  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TOLERANCE = {"bf16": 2e-2, "fp32": 1e-5}


# ---------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_time(fn: Callable[[], object], device: torch.device, *, batches: int = 5, min_batch_s: float = 0.05) -> float:
    """Median seconds per call of ``fn`` over ``batches`` batches (warm already)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - start, 1e-6)
    if one > 0.5:  # slow baselines (SDPA at 256K tokens): fewer batches of one call
        batches = min(batches, 3)
    per_batch = max(1, min(200, int(min_batch_s / one)))
    times = []
    for _ in range(batches):
        _sync(device)
        start = time.perf_counter()
        for _ in range(per_batch):
            fn()
        _sync(device)
        times.append((time.perf_counter() - start) / per_batch)
    return statistics.median(times)


def first_call(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def alternating_gpu_times(
    fns: dict[str, Callable[[], object]], device: torch.device, *, rounds: int = 9, min_batch_s: float = 0.05
) -> dict[str, float]:
    """Median seconds per call of each of ``fns`` (warm already), their batches run in turn, round
    after round, so that a change of the device's clock or load falls on every contender alike."""
    per_batch = {}
    for name, fn in fns.items():
        one = max(first_call(fn, device), 1e-6)
        per_batch[name] = max(1, min(200, int(min_batch_s / one)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            _sync(device)
            start = time.perf_counter()
            for _ in range(per_batch[name]):
                fns[name]()
            _sync(device)
            times[name].append((time.perf_counter() - start) / per_batch[name])
    return {name: statistics.median(ts) for name, ts in times.items()}


def with_backward(fn: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> Callable[[], None]:
    def run() -> None:
        for t in inputs:
            t.grad = None
        out = fn()
        out.backward(torch.ones_like(out))

    return run


# ---------------------------------------------------------------------------------------
# The rows: attnkit call, FlexAttention with a hand-written mask_mod, SDPA with a dense mask
# ---------------------------------------------------------------------------------------


def hand_flex(mask_mod, s: int, device: torch.device):
    """What a FlexAttention user writes: create_block_mask once, compiled flex_attention."""
    from torch.nn.attention.flex_attention import create_block_mask

    start = time.perf_counter()
    block_mask = create_block_mask(mask_mod, None, None, s, s, device=device)
    _sync(device)
    build = time.perf_counter() - start
    return block_mask, build


def _hand_flex_call(q, k, v, block_mask):
    # The same compiled function (and so the same raised recompile limit) as attnkit's calls.
    return flex.compiled_flex()(q, k, v, block_mask=block_mask)


def masked_rows(s: int, device: torch.device) -> list[dict]:
    """(name, attnkit mask, hand-written mask_mod, is the pattern causal)."""
    docs = (torch.arange(s, device=device) // 2048).to(torch.int32)
    rnd = masks.random(0.05).to(device).fn
    return [
        {
            "name": "causal & sliding_window(256)",
            "mask": lambda: masks.causal() & masks.sliding_window(256),
            "mask_mod": lambda b, h, q, kv: (q >= kv) & (q - kv <= 256),
        },
        {
            "name": "document(2048-token docs) & causal",
            "mask": lambda: masks.document(torch.arange(s) // 2048) & masks.causal(),
            "mask_mod": lambda b, h, q, kv: (docs[q] == docs[kv]) & (q >= kv),
        },
        {
            "name": "strided(128) & causal",
            "mask": lambda: masks.strided(128) & masks.causal(),
            "mask_mod": lambda b, h, q, kv: ((q - kv) % 128 == 0) & (q >= kv),
        },
        {
            "name": "sliding_window(512, 512) | global_tokens([0])",
            "mask": lambda: masks.sliding_window(512, 512) | masks.global_tokens([0]),
            "mask_mod": lambda b, h, q, kv: ((q - kv).abs() <= 512) | (q == 0) | (kv == 0),
        },
        {
            "name": "random(0.05)",
            "mask": lambda: masks.random(0.05),
            "mask_mod": lambda b, h, q, kv: rnd(b, h, q, kv),
        },
    ]


def bench_masked(dtype_name: str, s: int, h: int, d: int, device: torch.device, backward: bool, log) -> list[dict]:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(1, h, s, d, device=device, dtype=dtype, generator=gen).requires_grad_(backward) for _ in range(3)
    )
    results = []

    def measure(name: str, fns: dict[str, Callable[[], torch.Tensor]], flops: float, extra: dict) -> None:
        row = {"row": name, "dtype": dtype_name, "pass": "fwd+bwd" if backward else "fwd", "s": s, **extra}
        for who, fn in fns.items():
            try:
                run = with_backward(fn, (q, k, v)) if backward else fn
                row[f"{who}_first_s"] = first_call(run, device)
                row[f"{who}_ms"] = gpu_time(run, device) * 1e3
            except Exception as err:  # recorded, so one failure does not end the run
                row[f"{who}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        row["flops"] = flops
        results.append(row)
        log(row)

    flops = attention_flops(1, h, s, s, d, causal=True) * (3.5 if backward else 1)
    measure(
        "attention(causal=True)",
        {
            "attnkit": lambda: attnkit.attention(q, k, v, causal=True),
            "sdpa_is_causal": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        },
        flops,
        {},
    )
    for spec in masked_rows(s, device):
        block_mask, build_s = hand_flex(spec["mask_mod"], s, device)
        flex.clear_cache()
        start = time.perf_counter()
        flex.cached_block_mask(spec["mask"](), 1, h, s, s, device, None, None, 0)
        _sync(device)
        attnkit_build_s = time.perf_counter() - start
        flex.clear_cache()
        mask = spec["mask"]()  # built once, as a user would
        dense = mask.to_dense(s, s, device=device)  # [1, 1, s, s]
        measure(
            f"attention(mask={spec['name']})",
            {
                "attnkit": lambda mask=mask: attnkit.attention(q, k, v, mask=mask),
                "flex_hand": lambda bm=block_mask: _hand_flex_call(q, k, v, bm),
                "sdpa_dense_mask": lambda dense=dense: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=dense
                ),
            },
            flops,
            {"block_mask_s": {"attnkit": attnkit_build_s, "flex_hand": build_s}},
        )
        del dense
    window_bm, _ = hand_flex(lambda b, h_, q_, kv: (q_ >= kv) & (q_ - kv <= 256), s, device)
    measure(
        "local_attention(window=256, causal=True)",
        {
            "attnkit": lambda: attnkit.local_attention(q, k, v, window=256, causal=True),
            "flex_hand": lambda: _hand_flex_call(q, k, v, window_bm),
            "sdpa_is_causal": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        },
        flops,
        {},
    )
    strided_bm, _ = hand_flex(lambda b, h_, q_, kv: ((q_ - kv) % 128 == 0) & (q_ >= kv), s, device)
    measure(
        "sparse_attention(mask=strided(128), causal=True, permute=128)",
        {
            "attnkit": lambda: attnkit.sparse_attention(q, k, v, mask=masks.strided(128), causal=True, permute=128),
            "flex_hand": lambda: _hand_flex_call(q, k, v, strided_bm),
        },
        flops,
        {},
    )
    return results


def bench_local(dtype_name: str, s: int, h: int, d: int, device: torch.device, backward: bool, log) -> dict:
    """``local_attention(window=256, causal=True)`` against FlexAttention with the hand-written
    ``mask_mod`` and ``create_block_mask`` for the same window, timed in alternation; also
    ``attention(mask=causal & sliding_window(256))`` and the hand-written call on attnkit's block
    mask, which tell a slower call path from a slower block mask."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(1, h, s, d, device=device, dtype=dtype, generator=gen).requires_grad_(backward) for _ in range(3)
    )
    window_bm, _ = hand_flex(lambda b, h_, q_, kv: (q_ >= kv) & (q_ - kv <= 256), s, device)
    attnkit_bm = flex.cached_block_mask(masks.sliding_window(256, 0), 1, h, s, s, device, None, None, 0)
    mask = masks.causal() & masks.sliding_window(256)
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "attnkit": lambda: attnkit.local_attention(q, k, v, window=256, causal=True),
        "flex_hand": lambda: _hand_flex_call(q, k, v, window_bm),
        "attnkit_mask": lambda: attnkit.attention(q, k, v, mask=mask),
        "flex_hand_attnkit_block_mask": lambda: _hand_flex_call(q, k, v, attnkit_bm),
    }
    runs = {who: with_backward(fn, (q, k, v)) if backward else fn for who, fn in calls.items()}
    row: dict = {
        "row": "local_attention(window=256, causal=True)",
        "dtype": dtype_name,
        "pass": _pass(backward),
        "s": s,
    }
    for who, run in runs.items():
        row[f"{who}_first_s"] = first_call(run, device)
    row.update({f"{who}_ms": t * 1e3 for who, t in alternating_gpu_times(runs, device).items()})
    log(row)
    return row


def local_markdown(data: dict) -> str:
    """The section of the alternating local-attention rows (``results/gpu_local.md``)."""
    device = f"Device: **{data['device']}**. " if data.get("device") else ""
    sh = data["shape"]
    lines = [
        "## GPU: local attention against FlexAttention, timed in alternation (`bench_gpu.py --only local`)",
        "",
        f"{device}b=1, h={sh['h']}, s={sh['s']}, d={sh['d']}. Each contender's batches of calls run in turn, "
        "9 rounds, medians (compile excluded): `local_attention(window=256, causal=True)`; "
        "`flex_hand`, compiled FlexAttention with the hand-written `mask_mod` `(q >= kv) & (q - kv <= 256)` "
        "and `create_block_mask`; `attention(mask=causal & sliding_window(256))`; and the hand-written call "
        "given attnkit's block mask. \"speed vs X\" = X's time ÷ `local_attention`'s.",
        "",
    ]
    table = [
        [
            r["dtype"],
            r["pass"],
            _ms(r, "attnkit"),
            _ms(r, "flex_hand"),
            _ms(r, "attnkit_mask"),
            _ms(r, "flex_hand_attnkit_block_mask"),
            _ratio(r, "attnkit", "flex_hand"),
        ]
        for r in data["rows"]
    ]
    if table:
        lines.append(
            _table(
                [
                    "dtype",
                    "pass",
                    "local_attention ms",
                    "flex_hand ms",
                    "attention(mask) ms",
                    "flex_hand, attnkit's block mask ms",
                    "speed vs flex_hand",
                ],
                table,
            )
        )
    else:
        lines.append("Not measured yet: no GPU has run it.")
    return "\n".join(lines)


def bench_many_masks(s: int, h: int, d: int, device: torch.device, log) -> dict:
    """A new mask in a warm process: first-call time, and whether 10 masks in a row (more
    than torch.compile's default limit of 8) all stay compiled (steady time of each against
    the first mask's)."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, h, s, d, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(3))
    rows = []
    for i in range(10):
        mask = masks.causal() & masks.sliding_window(200 + 25 * i)
        first = first_call(lambda: attnkit.attention(q, k, v, mask=mask), device)
        steady = gpu_time(lambda: attnkit.attention(q, k, v, mask=mask), device, batches=3)
        rows.append({"window": 200 + 25 * i, "first_s": first, "steady_ms": steady * 1e3})
    result = {
        "s": s,
        "masks": rows,
        "worst_steady_over_first_mask": max(r["steady_ms"] for r in rows) / rows[0]["steady_ms"],
    }
    log(result)
    return result


# ---------------------------------------------------------------------------------------
# --check: every kernel on the device against the float64 CPU reference
# ---------------------------------------------------------------------------------------


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(got)):
        return float("inf")
    scale = ref[finite].abs().max().item() if finite.any() else 1.0
    return (got[finite] - ref[finite]).abs().max().item() / max(scale, 1e-30) if finite.any() else 0.0


def check_masks_bits(device: torch.device, log) -> dict:
    """Every built-in mask inside one compiled Flex kernel on the device (head i under mask
    i): lowering and bits, against the same masks evaluated densely in eager code."""
    from torch.nn.attention.flex_attention import create_block_mask

    s, b = 1000, 2
    ids = torch.arange(s) // 300
    hf = torch.ones(b, s, dtype=torch.long)
    hf[1, 700:] = 0
    named = {
        "full": masks.full(),
        "causal": masks.causal(),
        "sliding_window": masks.sliding_window(37, 5),
        "padding": masks.padding([300, 1000]),
        "strided": masks.strided(7),
        "fixed": masks.fixed(64, 8),
        "random": masks.random(0.05, seed=3),
        "global_tokens": masks.global_tokens([0, 511, 999]),
        "document": masks.document(ids),
        "document_per_batch": masks.document(torch.stack([ids, ids.flip(0)])),
        "from_dense": masks.from_dense(torch.rand(s, s, generator=torch.Generator().manual_seed(0)) < 0.3),
        "from_hf_padding": masks.from_hf_padding(hf),
        "composed": (masks.causal() & masks.sliding_window(50)) | masks.global_tokens([3]),
        "inverted": ~masks.strided(3) & masks.causal(),
    }
    fns = [m.to(device).fn for m in named.values()]

    def by_head(bi, hi, q_idx, kv_idx):
        allowed = fns[0](bi, hi, q_idx, kv_idx)
        for i, fn in enumerate(fns[1:], start=1):
            allowed = torch.where(hi == i, fn(bi, hi, q_idx, kv_idx), allowed)
        return allowed

    h = len(fns)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, s, 64, generator=gen) for _ in range(3))
    out = {}
    try:
        block_mask = create_block_mask(by_head, b, h, s, s, device=device)
        got = flex.compiled_flex()(q.to(device), k.to(device), v.to(device), block_mask=block_mask)
        for i, (name, mask) in enumerate(named.items()):
            ref = attnkit.attention(
                q[:, i : i + 1].double(),
                k[:, i : i + 1].double(),
                v[:, i : i + 1].double(),
                mask=mask.to_dense(s, s, batch_size=b),
                engine="reference",
            )
            out[name] = _rel(got[:, i : i + 1], ref)
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {str(err)[:400]}"
    log({"mask_bits_fp32_rel_err": out})
    return out


def check_kernels(dtype_name: str, device: torch.device, log) -> list[dict]:
    dtype = DTYPES[dtype_name]
    b, h, h_kv, s, d = 2, 4, 2, 1000, 64
    gen = torch.Generator().manual_seed(2)
    base = [torch.randn(b, n, s, d, generator=gen, dtype=torch.float64) for n in (h, h_kv, h_kv)]
    bias = torch.randn(1, h, s, s, generator=gen, dtype=torch.float64) * 0.5
    cases: dict[str, Callable] = {
        "attention causal & sliding_window(100)": lambda q, k, v, **e: attnkit.attention(
            q, k, v, mask=masks.causal() & masks.sliding_window(100), **e
        ),
        "attention document & causal": lambda q, k, v, **e: attnkit.attention(
            q, k, v, mask=masks.document(torch.arange(s) // 300) & masks.causal(), **e
        ),
        "attention window | global": lambda q, k, v, **e: attnkit.attention(
            q, k, v, mask=masks.sliding_window(64, 64) | masks.global_tokens([0]), **e
        ),
        "attention random(0.05)": lambda q, k, v, **e: attnkit.attention(q, k, v, mask=masks.random(0.05), **e),
        "attention strided(16) & causal, 700 queries": lambda q, k, v, **e: attnkit.attention(
            q[:, :, 300:], k, v, mask=masks.strided(16) & masks.causal(), **e
        ),
        "attention padding & causal + bias": lambda q, k, v, **e: attnkit.attention(
            q, k, v, mask=masks.padding([0, 800]) & masks.causal(), bias=bias.to(q), **e
        ),
        "local_attention(64, causal)": lambda q, k, v, **e: attnkit.local_attention(
            q, k, v, window=64, causal=True, **e
        ),
        "local_attention((32, 16))": lambda q, k, v, **e: attnkit.local_attention(q, k, v, window=(32, 16), **e),
        "sparse_attention strided(16) permute": lambda q, k, v, **e: attnkit.sparse_attention(
            q, k, v, mask=masks.strided(16), causal=True, permute=16, **e
        ),
    }
    rows = []
    for name, fn in cases.items():
        row = {"case": name, "dtype": dtype_name}
        try:
            ref_in = [t.clone().requires_grad_() for t in base]
            engine = {"engine": "reference"} if name.startswith("attention") else {"engine": "blockwise"}
            ref = fn(*ref_in, **engine)
            ref.backward(torch.ones_like(ref))
            dev_in = [t.to(device=device, dtype=dtype).requires_grad_() for t in base]
            got = fn(*dev_in)
            got.backward(torch.ones_like(got))
            row["out"] = _rel(got, ref)
            row.update({f"d{n}": _rel(g.grad, r.grad) for n, g, r in zip("qkv", dev_in, ref_in)})
            row["ok"] = max(row["out"], row["dq"], row["dk"], row["dv"]) <= TOLERANCE[dtype_name]
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            row["ok"] = False
        rows.append(row)
        log(row)
    # lse from Flex, and weights on demand from it
    row = {"case": "tiled_attention lse + weights_on_demand", "dtype": dtype_name}
    try:
        mask = masks.document(torch.arange(s) // 300) & masks.causal()
        ref = attnkit.tiled_attention(*base, mask=mask, return_lse=True, engine="blockwise")
        dev = [t.to(device=device, dtype=dtype) for t in base]
        got = attnkit.tiled_attention(*dev, mask=mask, return_lse=True)
        row["out"], row["lse"] = _rel(got.output, ref.output), _rel(got.lse, ref.lse)
        w_ref = attnkit.functional.weights_on_demand(base[0], base[1], ref.lse, heads=[1], rows=slice(0, 64), mask=mask)
        w_got = attnkit.functional.weights_on_demand(dev[0], dev[1], got.lse, heads=[1], rows=slice(0, 64), mask=mask)
        row["weights"] = _rel(w_got, w_ref)
        row["ok"] = max(row["out"], row["lse"], row["weights"]) <= TOLERANCE[dtype_name]
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        row["ok"] = False
    rows.append(row)
    log(row)
    return rows


# ---------------------------------------------------------------------------------------
# Causal linear attention: the fused kernels against SDPA is_causal and flash-linear-attention
# ---------------------------------------------------------------------------------------

LINEAR_HEADS, LINEAR_HEAD_DIM = 8, 64
# Nominal memory bandwidth (bytes/s) by device name, for the fraction of the datasheet figure;
# the fraction of a measured device-to-device copy is reported for every device.
NOMINAL_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 80GB HBM3", 3.35e12),
    ("H100 PCIe", 2.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100-SXM4-40GB", 1.555e12),
    ("A100-PCIE-40GB", 1.555e12),
)


def fla_linear_ops():
    """flash-linear-attention's chunked linear attention (``pip install fla-core``), or the
    reason it is not here."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn, fused_chunk_linear_attn
    except Exception as err:  # absent, or unable to start on this machine
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    return {"fla_chunk": chunk_linear_attn, "fla_fused_chunk": fused_chunk_linear_attn}, None


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes`` (read and written)."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    seconds = gpu_time(lambda: y.copy_(x), device, batches=3)
    return 2 * nbytes / seconds


def nominal_bandwidth(device_name: str) -> float | None:
    return next((bw for key, bw in NOMINAL_BANDWIDTH if key in device_name), None)


def linear_io_bytes(b: int, h: int, s: int, d: int, element_size: int, backward: bool) -> int:
    """The least memory traffic of a call: q, k, v read and the output written; the backward
    pass also reads q, k, v, the output and its gradient, and writes three gradients."""
    tensors = 4 + (8 if backward else 0)
    return tensors * b * h * s * d * element_size


def bench_linear(
    dtype_name: str,
    s: int,
    device: torch.device,
    backward: bool,
    log,
    *,
    engine: str,
    bandwidth: dict,
    with_compiled: bool,
) -> dict:
    """One row: causal linear attention (elu) at length ``s`` by each contender, on the same
    inputs (fla-core's in its own ``[b, s, h, d]`` layout, made once outside the timing)."""
    dtype = DTYPES[dtype_name]
    h, d = LINEAR_HEADS, LINEAR_HEAD_DIM
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(1, h, s, d, device=device, dtype=dtype, generator=gen).requires_grad_(backward) for _ in range(3)
    )
    contenders: dict[str, tuple[Callable[[], torch.Tensor], tuple[torch.Tensor, ...]]] = {
        "attnkit": (
            lambda: attnkit.linear_attention(q, k, v, feature_map="elu", causal=True, engine=engine),
            (q, k, v),
        ),
        "sdpa_is_causal": (
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
            (q, k, v),
        ),
    }
    if with_compiled:
        contenders["attnkit_compiled"] = (
            lambda: attnkit.linear_attention(q, k, v, feature_map="elu", causal=True, engine="compiled"),
            (q, k, v),
        )
    row: dict = {"row": "linear_attention(elu, causal=True)", "dtype": dtype_name, "pass": _pass(backward), "s": s}
    fla, why_not = fla_linear_ops()
    if fla is None:
        row["fla_missing"] = why_not
    else:
        q_t, k_t, v_t = (x.detach().transpose(1, 2).contiguous().requires_grad_(backward) for x in (q, k, v))
        for name, fn in fla.items():
            contenders[name] = (
                lambda fn=fn: fn(
                    torch.nn.functional.elu(q_t) + 1,
                    torch.nn.functional.elu(k_t) + 1,
                    v_t,
                    scale=1.0,
                    normalize=True,
                )[0],
                (q_t, k_t, v_t),
            )
    for who, (fn, inputs) in contenders.items():
        try:
            run = with_backward(fn, inputs) if backward else fn
            row[f"{who}_first_s"] = first_call(run, device)
            row[f"{who}_ms"] = gpu_time(run, device) * 1e3
        except Exception as err:  # recorded, so one failure does not end the run
            row[f"{who}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    row["io_bytes"] = linear_io_bytes(1, h, s, d, q.element_size(), backward)
    if "attnkit_ms" in row:
        achieved = row["io_bytes"] / (row["attnkit_ms"] / 1e3)
        row["attnkit_bytes_per_s"] = achieved
        row["fraction_of_copy"] = achieved / bandwidth["copy"]
        if bandwidth.get("nominal"):
            row["fraction_of_nominal"] = achieved / bandwidth["nominal"]
    log(row)
    return row


def _pass(backward: bool) -> str:
    return "fwd+bwd" if backward else "fwd"


def check_linear(dtype_name: str, device: torch.device, log, *, engine: str, quick: bool) -> list[dict]:
    """linear_attention on the device against the eager engine in float64 on the CPU: the
    output, the gradients of q, k, v and the final state (``kv`` and ``z`` at the scale of the
    true features), each as ``max|got - ref| / max|ref|``."""
    dtype = DTYPES[dtype_name]
    b, h, h_kv, s, d = (1, 4, 2, 200, 16) if quick else (2, 4, 2, 1000, 64)
    gen = torch.Generator().manual_seed(3)
    base = [torch.randn(b, n, s, d, generator=gen, dtype=torch.float64) for n in (h, h_kv, h_kv)]
    cut = s // 5  # the prompt absorbed into a state before the "from a state" case
    # (Few distinct kernels: the fp32 ones take a while to compile on first use.)
    cases: dict[str, dict] = {
        "elu, grouped heads": {"feature_map": "elu"},
        "relu": {"feature_map": "relu"},
        "favor, eps=1e-3": {"feature_map": "favor", "eps": 1e-3},
        "callable x²": {"feature_map": lambda x: x.square()},
        f"elu from a {cut}-token state, {s - 2 * cut} queries of {s - cut} keys": {"feature_map": "elu", "prompt": cut},
    }
    rows = []
    for name, spec in cases.items():
        row: dict = {"case": name, "dtype": dtype_name}
        try:
            spec = dict(spec)
            prompt = spec.pop("prompt", 0)
            row.update(_linear_errors(base, prompt, spec, device, dtype, engine))
            row["ok"] = max(v for k, v in row.items() if k in LINEAR_CHECKED) <= TOLERANCE[dtype_name]
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            row["ok"] = False
        rows.append(row)
        log(row)
    return rows


LINEAR_CHECKED = ("out", "dq", "dk", "dv", "kv", "z")


def _linear_errors(
    base: list[torch.Tensor], prompt: int, kw: dict, device: torch.device, dtype: torch.dtype, engine: str
) -> dict:
    """Relative errors of one call on the device (``engine``) against float64 eager on the CPU."""
    weights: list[torch.Tensor] = []

    def run(inputs: list[torch.Tensor], **extra) -> tuple[dict, tuple[torch.Tensor, ...]]:
        q, k, v = inputs
        state = None
        if prompt:
            fm = kw["feature_map"]
            state = attnkit.functional.linear_attention_state(k[:, :, :prompt], v[:, :, :prompt], feature_map=fm)
            q, k, v = q[:, :, 2 * prompt :], k[:, :, prompt:], v[:, :, prompt:]
        out, end = attnkit.linear_attention(q, k, v, causal=True, state=state, return_state=True, **kw, **extra)
        scale = torch.exp(end.log_shift.double())  # the state at the scale of the true features
        kv, z = end.kv.double() * scale[..., None, None], end.z.double() * scale[..., None]
        results = (out.double(), kv, z)
        if not weights:  # a fixed random direction, the same for both runs
            gen = torch.Generator().manual_seed(4)
            weights.extend(torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in results)
        loss = sum((t * w.to(t.device)).sum() for t, w in zip(results, weights))
        grads = torch.autograd.grad(loss, inputs)
        return dict(zip(("out", "kv", "z"), results)), grads

    ref_in = [t.clone().requires_grad_() for t in base]
    ref, ref_grads = run(ref_in, engine="eager")
    dev_in = [t.to(device=device, dtype=dtype).requires_grad_() for t in base]
    got, got_grads = run(dev_in, engine=engine)
    errors = {key: _rel(got[key], ref[key]) for key in ref}
    errors.update({f"d{n}": _rel(g, r) for n, g, r in zip("qkv", got_grads, ref_grads)})
    return errors


def linear_markdown(data: dict) -> str:
    """The section of the linear-attention rows and checks (``results/gpu_linear.md``)."""
    bw = data.get("bandwidth", {})
    device = f"Device: **{data['device']}**. " if data.get("device") else ""
    lines = [
        "## GPU: fused causal linear attention (`bench_gpu.py --only linear`)",
        "",
        f"{device}Causal linear attention (elu), b=1, h={LINEAR_HEADS}, d={LINEAR_HEAD_DIM}; "
        "attnkit's default engine (the fused Triton kernels on CUDA), against SDPA `is_causal` (exact softmax "
        "attention), flash-linear-attention's `chunk_linear_attn` and `fused_chunk_linear_attn` (fla-core, "
        "its own `[b, s, h, d]` layout, the same elu features and normaliser) and attnkit's compiled engine (64K "
        'only). Medians of batches of calls between synchronisations, compile excluded. "vs X" = X\'s time ÷ '
        "attnkit's. Bandwidth: the least bytes a call must move (q, k, v read, output written; backward also "
        "reads q, k, v, output and its gradient and writes three gradients) per second, as a fraction of a "
        "measured device copy"
        + (f" ({bw['copy'] / 1e9:.0f} GB/s)" if bw.get("copy") else "")
        + (f" and of the datasheet's {bw['nominal'] / 1e9:.0f} GB/s" if bw.get("nominal") else "")
        + ". Run: `python benchmarks/bench_gpu.py --only linear --check`.",
        "",
    ]
    if data.get("notes"):
        lines += [data["notes"], ""]
    rows = data.get("linear", [])
    if not rows:
        lines.append(f"Not measured yet: no GPU has run it (lengths {LINEAR_LENGTHS}, bf16 and fp32, fwd and fwd+bwd).")
    else:
        table = []
        for r in rows:
            table.append(
                [
                    f"{r['s'] // 1024}K" if r["s"] % 1024 == 0 else str(r["s"]),
                    r["dtype"],
                    r["pass"],
                    _ms(r, "attnkit"),
                    _ms(r, "sdpa_is_causal"),
                    _ms(r, "fla_chunk"),
                    _ms(r, "fla_fused_chunk"),
                    _ms(r, "attnkit_compiled"),
                    _ratio(r, "attnkit", "sdpa_is_causal"),
                    _ratio(r, "attnkit", "fla_chunk"),
                    _ratio(r, "attnkit", "fla_fused_chunk"),
                    f"{r['fraction_of_copy']:.2f}" if "fraction_of_copy" in r else "–",
                    f"{r['fraction_of_nominal']:.2f}" if "fraction_of_nominal" in r else "–",
                ]
            )
        lines.append(
            _table(
                [
                    "s",
                    "dtype",
                    "pass",
                    "attnkit ms",
                    "sdpa is_causal ms",
                    "fla chunk ms",
                    "fla fused_chunk ms",
                    "compiled engine ms",
                    "vs sdpa",
                    "vs fla chunk",
                    "vs fla fused_chunk",
                    "bandwidth / copy",
                    "bandwidth / datasheet",
                ],
                table,
            )
        )
        missing = {r["fla_missing"] for r in rows if "fla_missing" in r}
        if missing:
            lines += ["", f"fla-core was not measured: {'; '.join(sorted(missing))}."]
    check = data.get("check", {})
    crows = [
        [r["case"], r["dtype"], *(f"{r[key]:.1e}" if key in r else "–" for key in LINEAR_CHECKED)]
        + ["yes" if r.get("ok") else f"**no** {r.get('error', '')}"]
        for name in DTYPES
        for r in check.get(name, [])
    ]
    if crows:
        lines += [
            "",
            "Correctness on the device (`--check`), relative error against the eager engine in float64 on the CPU "
            "(output, gradients of q, k, v through the output and the final state, the final state `kv` and `z`; "
            "tolerance 1e-5 fp32, 2e-2 bf16):",
            "",
            _table(["case", "dtype", *LINEAR_CHECKED, "within tolerance"], crows),
        ]
    errors = [
        f"- {r['s']} {r['dtype']} {r['pass']}: " + "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error"))
        for r in rows
        if any(k.endswith("_error") for k in r)
    ]
    if errors or data.get("skipped"):
        lines += ["", "Errors and skipped rows:", ""] + errors + [f"- skipped: {s_}" for s_ in data.get("skipped", [])]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------


def parse_dtypes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The names of ``--dtypes`` (comma-separated), each one of :data:`DTYPES`, or the
    parser's error."""
    dtypes = text.split(",")
    unknown = [name for name in dtypes if name not in DTYPES]
    if unknown:
        parser.error(f"--dtypes takes {', '.join(DTYPES)}, got {', '.join(unknown)}")
    return dtypes


def write_results_to(out_dir: Path, name: str, data: dict, markdown_text: str) -> None:
    """``NAME.json`` (with the environment) and ``NAME.md`` in ``out_dir`` (a script's
    ``--out``), in place of ``benchmarks/results``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(
        json.dumps({"environment": environment(), **data}, indent=2, default=str) + "\n"
    )
    (out_dir / f"{name}.md").write_text(markdown_text + "\n")


def main(argv: list[str] | None = None) -> dict:
    parser = arguments()
    args = parser.parse_args(argv)
    dtypes = parse_dtypes(parser, args.dtypes)
    lengths_arg = args.lengths or ("1024" if args.quick else LINEAR_LENGTHS)
    try:
        lengths = [int(x) for x in lengths_arg.split(",")]
    except ValueError:
        parser.error(f"--lengths takes comma-separated integers, got {lengths_arg!r}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured (run it on a machine with a GPU)")
        return {}
    deadline = time.perf_counter() + args.budget
    s, h, d = (512, 4, 64) if args.quick else (16384, 16, 64)
    backward_ok = device.type != "cpu"  # torch's CPU FlexAttention is forward only
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    log_lines: list[str] = []

    def log(item: dict) -> None:
        line = json.dumps(item, default=str)
        log_lines.append(line)
        print(line, flush=True)

    data: dict = {
        "device": device_name,
        "shape": {"b": 1, "h": h, "s": s, "d": d},
        "rows": [],
        "check": {},
        "skipped": [],
    }
    linear: dict = {"device": device_name, "lengths": lengths, "linear": [], "check": {}, "skipped": []}
    local: dict = {"device": device_name, "shape": {"b": 1, "h": h, "s": s, "d": d}, "rows": [], "skipped": []}
    out_dir = args.out

    def save() -> None:
        parts = [
            ("gpu", "masked", data, markdown),
            ("gpu_linear", "linear", linear, linear_markdown),
            ("gpu_local", "local", local, local_markdown),
        ]
        for name, kind, part, render in parts:
            if args.only != kind and (args.only is not None or kind == "local"):
                continue
            if out_dir is None:
                write_results(name, part, render(part), update_docs=args.update_docs)
                continue
            write_results_to(out_dir, name, part, render(part))

    def in_time(what: str, part: dict) -> bool:
        if time.perf_counter() > deadline:
            part["skipped"].append(what)
            return False
        return True

    masked, linear_rows = args.only in (None, "masked"), args.only in (None, "linear")
    if masked:
        flex.raise_recompile_limit()  # for the hand-written baselines too
    if args.check:
        if masked:
            data["check"]["mask_bits"] = check_masks_bits(device, log)
        for name in dtypes:
            if masked and in_time(f"check {name}", data):
                data["check"][name] = check_kernels(name, device, log)
            if linear_rows and in_time(f"check {name}", linear):
                linear["check"][name] = check_linear(name, device, log, engine=args.linear_engine, quick=args.quick)
        save()
    passes = [(name, backward) for name in dtypes for backward in ((False, True) if backward_ok else (False,))]
    if linear_rows:
        # The fused kernels' work is bounded by memory traffic: measure what the device can move.
        linear["bandwidth"] = {
            "copy": copy_bandwidth(device, (1 << 30) if device.type == "cuda" else (1 << 26)),
            "nominal": nominal_bandwidth(device_name),
        }
        log(linear["bandwidth"])
        for s_lin in lengths:
            for name, backward in passes:
                if in_time(f"linear s={s_lin} {name} {_pass(backward)}", linear):
                    linear["linear"].append(
                        bench_linear(
                            name,
                            s_lin,
                            device,
                            backward,
                            log,
                            engine=args.linear_engine,
                            bandwidth=linear["bandwidth"],
                            with_compiled=device.type == "cuda" and s_lin == 65536 and not args.no_compiled_engine,
                        )
                    )
                    save()
    for name, backward in passes if args.only == "local" else []:
        if in_time(f"local {name} {_pass(backward)}", local):
            local["rows"].append(bench_local(name, s, h, d, device, backward, log))
            save()
    # Most wanted first: a run cut short by --budget keeps what matters.
    for i, (name, backward) in enumerate(passes if masked else []):
        what = f"{name} {_pass(backward)}"
        if in_time(what, data):
            try:
                data["rows"] += bench_masked(name, s, h, d, device, backward, log)
            except Exception:
                data["skipped"].append(f"{what}: {traceback.format_exc(limit=2)}")
            save()
        if i == 1 and in_time("many masks", data):
            data["many_masks"] = bench_many_masks(s, h, d, device, log)
            save()
    save()
    return {"masked": data, "linear": linear}


def _ms(row: dict, who: str) -> str:
    if f"{who}_ms" in row:
        return f"{row[f'{who}_ms']:.3f}"
    return "error" if f"{who}_error" in row else "–"


def _ratio(row: dict, faster: str, slower: str) -> str:
    if f"{faster}_ms" in row and f"{slower}_ms" in row:
        return f"{row[f'{slower}_ms'] / row[f'{faster}_ms']:.2f}×"
    return "–"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table whose cells may hold ``|`` (mask names such as ``a | b``)."""
    return markdown_table(headers, [[cell.replace("|", "\\|") for cell in row] for row in rows])


def markdown(data: dict) -> str:
    sh = data["shape"]
    lines = [
        "## GPU: masked, local and sparse attention (`bench_gpu.py`)",
        "",
        f"Device: **{data['device']}**. b=1, h={sh['h']}, s={sh['s']}, d={sh['d']}. Medians of batches of calls between synchronisations, compile excluded "
        "(first calls listed apart). \"speed vs X\" = X's time ÷ attnkit's time (above 1: attnkit is faster). "
        "`flex_hand` is compiled FlexAttention with a hand-written `mask_mod` and `create_block_mask`; "
        "`sdpa` uses a dense bool mask (or `is_causal`). Run: `python benchmarks/bench_gpu.py --check`.",
        "",
    ]
    rows = []
    for r in data["rows"]:
        sdpa = "sdpa_dense_mask" if "sdpa_dense_mask_ms" in r or "sdpa_dense_mask_error" in r else "sdpa_is_causal"
        rows.append(
            [
                r["row"],
                r["dtype"],
                r["pass"],
                _ms(r, "attnkit"),
                _ms(r, "flex_hand"),
                _ms(r, sdpa),
                _ratio(r, "attnkit", "flex_hand"),
                _ratio(r, "attnkit", sdpa),
                f"{r.get('attnkit_first_s', float('nan')):.2f}",
            ]
        )
    if rows:
        lines.append(
            _table(
                [
                    "call",
                    "dtype",
                    "pass",
                    "attnkit ms",
                    "flex_hand ms",
                    "sdpa ms",
                    "speed vs flex_hand",
                    "speed vs sdpa",
                    "attnkit first call s",
                ],
                rows,
            )
        )
    errors = [
        f"- {r['row']} ({r['dtype']}, {r['pass']}): "
        + "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error"))
        for r in data["rows"]
        if any(k.endswith("_error") for k in r)
    ]
    if "many_masks" in data:
        mm = data["many_masks"]
        firsts = [m["first_s"] for m in mm["masks"]]
        lines += [
            "",
            f"A new mask in a warm process (10 sliding windows in a row, bf16, s={mm['s']}): first call "
            f"{min(firsts):.2f}–{max(firsts):.2f} s (block mask and compile), steady time of the slowest "
            f"{mm['worst_steady_over_first_mask']:.2f}× the first mask's: all stay compiled.",
        ]
    block_rows = [
        [r["row"], r["dtype"], f"{r['block_mask_s']['attnkit']:.3f}", f"{r['block_mask_s']['flex_hand']:.3f}"]
        for r in data["rows"]
        if "block_mask_s" in r and r["pass"] == "fwd"
    ]
    if block_rows:
        lines += [
            "",
            "Block-mask build, seconds (attnkit from the mask's block test where it has one; "
            "`create_block_mask` for the hand-written one):",
            "",
            _table(["mask", "dtype", "attnkit s", "create_block_mask s"], block_rows),
        ]
    check = data.get("check") or {}
    if check:
        lines += [
            "",
            "Correctness on the device (`--check`), relative error against float64 on the CPU "
            "(outputs and gradients of q, k, v; tolerance 1e-5 fp32, 2e-2 bf16):",
            "",
        ]
        crow = []
        for name in DTYPES:
            for r in check.get(name, []):
                vals = [f"{r[key]:.1e}" if key in r else "–" for key in ("out", "dq", "dk", "dv", "lse", "weights")]
                crow.append([r["case"], name, *vals, "yes" if r.get("ok") else f"**no** {r.get('error', '')}"])
        if crow:
            lines.append(_table(["case", "dtype", "out", "dq", "dk", "dv", "lse", "weights", "within tolerance"], crow))
        bits = check.get("mask_bits", {})
        if bits:
            lines += [
                "",
                "Every built-in mask inside one compiled Flex kernel on the device, against eager evaluation "
                "(float32 relative error): "
                + ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k}: {v}" for k, v in bits.items())
                + ".",
            ]
    if errors or data["skipped"]:
        lines += ["", "Errors and skipped rows:", ""] + errors + [f"- skipped: {s_}" for s_ in data["skipped"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
