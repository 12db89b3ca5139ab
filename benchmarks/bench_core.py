"""attnkit.attention's fused path against F.scaled_dot_product_attention, full and causal.

Both are shown as a fraction of torch.mm throughput measured in the same run.
Run alone: ``python benchmarks/bench_core.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import benchmark_parser  # noqa: E402


def arguments() -> argparse.ArgumentParser:
    return benchmark_parser(__doc__)


if __name__ == "__main__":
    # --help and a mistyped option end here, before PyTorch is imported or a model touched.
    arguments().parse_args()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnkit  # noqa: E402
from benchmarks.common import attention_flops, interleaved_times, markdown_table, matmul_gflops, write_results  # noqa: E402

B, H, D = 1, 8, 64
LENGTHS = (1024, 4096)


def main(argv: list[str] | None = None) -> dict:
    args = arguments().parse_args(argv)
    torch.manual_seed(0)
    mm = matmul_gflops()
    rows = []
    for s in LENGTHS:
        q, k, v = (torch.randn(B, H, s, D) for _ in range(3))
        for causal in (False, True):
            times = interleaved_times(
                {
                    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    "attnkit": lambda: attnkit.attention(q, k, v, causal=causal),
                },
                repeat=11 if s <= 1024 else 8,
            )
            flops = attention_flops(B, H, s, s, D, causal)
            rows.append(
                {
                    "s": s,
                    "causal": causal,
                    "sdpa_s": times["sdpa"],
                    "attnkit_s": times["attnkit"],
                    "speed_vs_sdpa": times["sdpa"] / times["attnkit"],
                    "sdpa_fraction_of_mm": flops / times["sdpa"] / 1e9 / mm,
                    "attnkit_fraction_of_mm": flops / times["attnkit"] / 1e9 / mm,
                }
            )
            r = rows[-1]
            print(
                f"s={s:5d} {'causal' if causal else 'full  '}  sdpa {r['sdpa_s'] * 1e3:8.2f} ms  "
                f"attnkit {r['attnkit_s'] * 1e3:8.2f} ms  speed {r['speed_vs_sdpa']:.3f}x  "
                f"of mm: sdpa {r['sdpa_fraction_of_mm']:.1%} attnkit {r['attnkit_fraction_of_mm']:.1%}"
            )
    table = markdown_table(
        ["s", "mask", "SDPA ms", "attnkit ms", "attnkit speed ÷ SDPA", "SDPA % of mm", "attnkit % of mm"],
        [
            [
                str(r["s"]),
                "causal" if r["causal"] else "none",
                f"{r['sdpa_s'] * 1e3:.2f}",
                f"{r['attnkit_s'] * 1e3:.2f}",
                f"{r['speed_vs_sdpa']:.3f}×",
                f"{r['sdpa_fraction_of_mm']:.1%}",
                f"{r['attnkit_fraction_of_mm']:.1%}",
            ]
            for r in rows
        ],
    )
    markdown = (
        "## Core: `attnkit.attention` vs `F.scaled_dot_product_attention`\n\n"
        f"b={B}, h={H}, d={D}, float32, forward; `torch.mm` (2048²) ran at {mm:.1f} GFLOP/s in the same run. "
        "Attention FLOPs = 4·b·h·s²·d (half for causal). Times are medians of interleaved runs.\n\n" + table
    )
    data = {"matmul_gflops": mm, "shape": {"b": B, "h": H, "d": D}, "rows": rows}
    write_results("core", data, markdown, update_docs=args.update_docs)
    return data


if __name__ == "__main__":
    main()
