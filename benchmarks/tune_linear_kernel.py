"""Launch settings of the fused causal linear-attention kernels, measured on a GPU: tokens per
chunk, warps per program, pipeline stages and the number of programs the sequence is cut into
(segments × heads), each combination timed forward and forward+backward on one shape.

    python benchmarks/tune_linear_kernel.py                 # bf16 and fp32, s=65536, h=8, d=64
    python benchmarks/tune_linear_kernel.py --quick --device cpu   # a dry run (Triton's interpreter)

attnkit's defaults are :func:`attnkit.functional.linear_triton.launch_options`,
:func:`attnkit.functional.linear_fused.fused_chunk_size` and
:data:`attnkit.functional.linear_fused.TARGET_PROGRAMS`; this script times the alternatives
around them, so that a default is changed on a measurement. Every setting's output is compared
with the defaults' (``max|a - b| / max|b|``): a setting that computes something else is flagged,
not ranked. Settings a GPU cannot hold (shared memory) are listed with the error.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from benchmarks.common import benchmark_parser  # noqa: E402

# The settings tried per dtype: chunk sizes, warps, stages, target program counts.
SWEEP = {
    "bf16": ((64, 128), (4, 8), (2, 3), (512, 1024, 4096)),
    "fp32": ((32, 64), (4, 8), (1, 2), (1024, 4096)),
}


def arguments() -> argparse.ArgumentParser:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32")
    parser.add_argument("--length", type=int, default=65536, help="tokens (default 65536)")
    parser.add_argument("--heads", type=int, default=8, help="heads (default 8)")
    parser.add_argument("--dim", type=int, default=64, help="head dimension (default 64)")
    parser.add_argument("--quick", action="store_true", help="a small shape and two settings per dtype (a dry run)")
    parser.add_argument("--device", default="cuda", help="device to run on (default cuda)")
    parser.add_argument("--out", type=Path, default=None, help="write linear_tune.{json,md} here, not results/")
    parser.add_argument(
        "--budget", type=float, default=240.0, help="seconds; settings left when it runs out are skipped"
    )
    return parser


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported.
    arguments().parse_args()

import json  # noqa: E402
from unittest import mock  # noqa: E402

import torch  # noqa: E402

import attnkit  # noqa: E402
from attnkit.functional import linear_fused, linear_triton  # noqa: E402
from benchmarks.bench_gpu import (  # noqa: E402
    DTYPES,
    first_call,
    gpu_time,
    parse_dtypes,
    with_backward,
    write_results_to,
)
from benchmarks.common import markdown_table, write_results  # noqa: E402


def default_setting(dtype: torch.dtype) -> dict:
    return {
        "chunk": linear_fused.fused_chunk_size(dtype),
        **linear_triton.launch_options(dtype),
        "programs": linear_fused.TARGET_PROGRAMS,
    }


def measure(setting: dict, q, k, v, reference: torch.Tensor | None) -> dict:
    """Times of one setting, forward and forward+backward, and its output's distance from the
    defaults' output."""
    launch = {"num_warps": setting["num_warps"], "num_stages": setting["num_stages"]}

    def call() -> torch.Tensor:
        return attnkit.linear_attention(
            q, k, v, feature_map="elu", causal=True, engine="triton", chunk_size=setting["chunk"]
        )

    row = dict(setting)
    with (
        mock.patch.object(linear_triton, "launch_options", lambda dtype: launch),
        mock.patch.object(linear_fused, "TARGET_PROGRAMS", setting["programs"]),
    ):
        try:
            with torch.no_grad():
                out = call()
            row["first_s"] = first_call(with_backward(call, (q, k, v)), q.device)
            with torch.no_grad():
                row["fwd_ms"] = gpu_time(call, q.device) * 1e3
            row["fwd_bwd_ms"] = gpu_time(with_backward(call, (q, k, v)), q.device) * 1e3
            if reference is not None:
                row["diff"] = ((out.float() - reference.float()).abs().max() / reference.float().abs().max()).item()
            row["out"] = out
        except Exception as err:  # recorded: a setting the device cannot hold
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    return row


def sweep(dtype_name: str, args, deadline: float, log) -> list[dict]:
    dtype = DTYPES[dtype_name]
    device = torch.device(args.device)
    s, h, d = (64, 1, 16) if args.quick else (args.length, args.heads, args.dim)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, h, s, d, device=device, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    default = default_setting(dtype)
    chunks, warps, stages, programs = SWEEP[dtype_name]
    settings = [
        {"chunk": c, "num_warps": w, "num_stages": st, "programs": p}
        for c, w, st, p in itertools.product(chunks, warps, stages, programs)
    ]
    settings = [default] + [x for x in settings if x != default]
    if args.quick:
        settings = settings[:2]
    rows, reference = [], None
    for setting in settings:
        if time.perf_counter() > deadline:
            rows.append({**setting, "error": "skipped: out of --budget"})
            continue
        row = measure(setting, q, k, v, reference)
        out = row.pop("out", None)
        if reference is None:
            reference = out
        row.update(dtype=dtype_name, s=s, h=h, d=d, default=setting == default)
        rows.append(row)
        log(row)
    return rows


def markdown(data: dict) -> str:
    device = f"Device: **{data['device']}**. " if data.get("device") else ""
    lines = [
        "## GPU: launch settings of the fused linear-attention kernels (`tune_linear_kernel.py`)",
        "",
        f'{device}Causal linear attention (elu), b=1, attnkit\'s `"triton"` engine, each setting timed on the '
        "same inputs (medians of batches of calls between synchronisations, compile excluded); "
        "fastest forward+backward first, the defaults marked. `programs`: segments × heads the "
        "sequence is cut into (`TARGET_PROGRAMS`); `diff`: the output's distance from the defaults' output. "
        "Run: `python benchmarks/tune_linear_kernel.py`.",
    ]
    for dtype_name, rows in data.get("sweep", {}).items():
        done = sorted((r for r in rows if "fwd_bwd_ms" in r), key=lambda r: r["fwd_bwd_ms"])
        failed = [r for r in rows if "error" in r]
        if not rows:
            continue
        lines += [
            "",
            f"{dtype_name}, s={rows[0].get('s', '?')}, h={rows[0].get('h', '?')}, d={rows[0].get('d', '?')}:",
            "",
        ]
        lines.append(
            markdown_table(
                ["chunk", "warps", "stages", "programs", "fwd ms", "fwd+bwd ms", "first call s", "diff", "default"],
                [
                    [
                        str(r["chunk"]),
                        str(r["num_warps"]),
                        str(r["num_stages"]),
                        str(r["programs"]),
                        f"{r['fwd_ms']:.3f}",
                        f"{r['fwd_bwd_ms']:.3f}",
                        f"{r['first_s']:.1f}",
                        f"{r['diff']:.1e}" if "diff" in r else "–",
                        "yes" if r.get("default") else "",
                    ]
                    for r in done
                ],
            )
        )
        if failed:
            lines += [""] + [
                f"- chunk {r['chunk']}, {r['num_warps']} warps, {r['num_stages']} stages, {r['programs']} programs: "
                f"{r['error']}"
                for r in failed
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = arguments()
    args = parser.parse_args(argv)
    dtypes = parse_dtypes(parser, args.dtypes)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("tune_linear_kernel: no CUDA device here; nothing measured (run it on a machine with a GPU)")
        return {}
    deadline = time.perf_counter() + args.budget
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"

    def log(item: dict) -> None:
        print(json.dumps(item, default=str), flush=True)

    data: dict = {"device": device_name, "sweep": {}}
    for name in dtypes:
        data["sweep"][name] = sweep(name, args, deadline, log)
        if args.out is None:
            write_results("linear_tune", data, markdown(data), update_docs=args.update_docs)
        else:
            write_results_to(args.out, "linear_tune", data, markdown(data))
    return data


if __name__ == "__main__":
    main()
