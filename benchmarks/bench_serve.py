"""Load test of ``attnkit serve`` on loopback: 20 concurrent clients send 10 requests each
to ``POST /api/attention`` and every answer must be a 200.

The server runs in its own process (so that the clients' Python does not share its
interpreter lock) with each model in turn: ``tiny``, a two-layer random model from the
tests, which measures the server's own overhead, and the real models that are fetched. The
latency of one request alone, measured first in the same run, is the baseline: the report
gives p50/p95 under load and their ratio to it.

    python benchmarks/bench_serve.py [--model tiny --model smollm2 ...] [--clients 20] [--requests 10]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import httpx  # noqa: E402

from benchmarks.common import markdown_table, write_results  # noqa: E402

TEXT = "The cat sat on the mat."
DEFAULT_MODELS = ("tiny", "smollm2", "minilm")


def _load(name: str):
    """``tiny`` from the tests, anything else from :func:`attnkit.models.load`."""
    if name == "tiny":
        from tests.serve.tiny_model import TinyModel

        return TinyModel()
    from attnkit.models import load

    return load(name)


def _serve(name: str, urls) -> None:
    """Child process: load the model, serve it on a free loopback port, report the URL."""
    from attnkit.serve import background, create_app

    try:
        app = create_app([name], loader=_load)
    except Exception as err:  # reported to the parent, which skips the model
        urls.put(f"error: {err}")
        return
    with background(app) as url:
        urls.put(url)
        threading.Event().wait()


def _percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def load_test(url: str, clients: int, requests: int) -> dict:
    """``clients`` threads, each with its own connection, send ``requests`` requests each,
    all released at once."""
    body = {"text": TEXT}
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(3):  # warm-up
            client.post("/api/attention", json=body).raise_for_status()
        alone = []
        for _ in range(10):
            start = time.perf_counter()
            response = client.post("/api/attention", json=body)
            alone.append(time.perf_counter() - start)
            response.raise_for_status()
        tokens = len(response.json()["sections"]["self"]["query_tokens"])

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    gate = threading.Barrier(clients)

    def client_loop() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            gate.wait()
            for _ in range(requests):
                start = time.perf_counter()
                try:
                    response = http.post("/api/attention", json=body)
                    ok = response.status_code == 200 and response.json()["format"] == "attnkit-viewer"
                    problem = None if ok else f"HTTP {response.status_code}"
                except Exception as err:  # counted, not raised: the test reports errors
                    problem = f"{type(err).__name__}: {err}"
                with lock:
                    latencies.append(time.perf_counter() - start)
                    if problem:
                        errors.append(problem)

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = [x * 1000 for x in latencies]
    return {
        "tokens": tokens,
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:5],
        "alone_ms": statistics.median(alone) * 1000,
        "p50_ms": _percentile(ms, 50),
        "p95_ms": _percentile(ms, 95),
        "max_ms": max(ms),
        "throughput_rps": len(latencies) / wall,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help=f"models to test (default: {', '.join(DEFAULT_MODELS)})")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=10, help="requests per client")
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    # The machine may be shared: its load says how much the absolute times mean.
    load_before = os.getloadavg()[0]
    results, skipped = {}, {}
    for name in args.model or DEFAULT_MODELS:
        urls = context.Queue()
        process = context.Process(target=_serve, args=(name, urls), daemon=True)
        process.start()
        try:
            url = urls.get(timeout=300)
            if url.startswith("error: "):
                skipped[name] = url.removeprefix("error: ")
                print(f"{name}: skipped ({skipped[name]})", flush=True)
                continue
            r = load_test(url, args.clients, args.requests)
        finally:
            process.terminate()
            process.join()
        results[name] = r
        print(f"{name}: {r['requests']} requests, {r['errors']} errors, alone {r['alone_ms']:.1f} ms, "
              f"p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, {r['throughput_rps']:.1f} req/s", flush=True)

    rows = [
        [name, str(r["tokens"]), str(r["requests"]), str(r["errors"]), f"{r['alone_ms']:.1f}", f"{r['p50_ms']:.1f}",
         f"{r['p95_ms']:.1f}", f"{r['max_ms']:.1f}", f"{r['p95_ms'] / r['alone_ms']:.1f}×",
         f"{r['throughput_rps']:.1f}"]
        for name, r in results.items()
    ]
    markdown = "\n".join([
        "## Serve: load test (`benchmarks/bench_serve.py`)",
        "",
        f"{args.clients} concurrent clients × {args.requests} requests each of `POST /api/attention` "
        f'("{TEXT}", every layer and head) on 127.0.0.1, the server in its own process; '
        "\"alone\" is the median of one request at a time, measured first in the same run. "
        "`tiny` is a two-layer random model: the server's own overhead. "
        f"Load average (1 min) on this {os.cpu_count()}-core machine: {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after.",
        "",
        markdown_table(["model", "tokens", "requests", "errors", "alone (ms)", "p50 (ms)", "p95 (ms)", "max (ms)",
                        "p95 / alone", "req/s"], rows),
    ] + ([""] + [f"Not measured: {name} ({why})." for name, why in skipped.items()] if skipped else []))
    write_results("serve", {"text": TEXT, "load_average": [load_before, os.getloadavg()[0]], "results": results,
                            "skipped": skipped}, markdown)
    errors = sum(r["errors"] for r in results.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
