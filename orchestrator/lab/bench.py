"""A small serving benchmark that prints `sglang.bench_serving`'s result block.

    python3 -m orchestrator.lab.bench --port P --num-prompts N [--host H]
        [--max-concurrency C] [--random-input-len I] [--random-output-len O]
        [--backend sglang|sglang-oai|vllm] [--timeout S]

It sends N random-length-free prompts (each asks for exactly O output tokens) to
`/generate` (or `/v1/completions` for the OpenAI-style backends) and prints the
`============ Serving Benchmark Result ============` block with the same labels and
column layout as SGLang's bench_serving, so a probe's metric regex such as
`Output token throughput \\(tok/s\\):\\s+([\\d.]+)` reads it unchanged. Options of the real
tool that do not apply here (`--dataset-name`, `--model`, ...) are accepted and ignored,
so a probe command written for a real host runs against the lab as it is.

Against the lab server the duration is the time its engine was busy, from the windows
the server reports with each answer (ENGINE_WINDOW_HEADER): a test's throughput then does
not depend on how busy the machine running it is. Against any other server it is the wall
clock.

Exit codes: 0 all requests succeeded; 1 the server refused, died or failed requests
mid-run (an error line on stderr says how many and why); 2 bad command line.
Standard library only: it runs on the same bare hosts as the simulated server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

_MAX_THREADS = 256
#: the lab server's answer header: when its engine generated the request ("START END",
#: seconds on the server's clock). With it on every answer, the benchmark's duration is
#: the time the engine was busy, so a loaded machine's scheduling delays between client
#: and server do not read as lost throughput; a server without it (a real one) is timed
#: on the wall clock, as bench_serving does.
ENGINE_WINDOW_HEADER = "X-Lab-Engine-Window"
#: the lab bench's request header naming its run (one per invocation): the lab server
#: starts a new burst of its noisy throughput on a new name, however soon the run follows
#: the last one (a probe's repeats run back to back; a gap alone would merge them)
BENCH_RUN_HEADER = "X-Lab-Bench-Run"
#: this invocation's name, sent with each of its requests
RUN_NAME = f"{os.getpid()}-{time.time_ns()}"


@dataclass
class Result:
    ok: bool
    prompt_len: int
    output_len: int = 0
    latency: float = 0.0
    ttft: float = 0.0
    error: str = ""
    window: tuple[float, float] | None = None  # ENGINE_WINDOW_HEADER, when the server sent it


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_serving.py", description="Benchmark the online serving throughput."
    )
    p.add_argument(
        "--backend",
        default="sglang",
        help="sglang uses /generate; sglang-oai, vllm and others /v1/completions",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:30000")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--disable-warmup", action="store_true")
    return p


class Client:
    """One HTTP/1.1 connection per worker thread, reused between its requests."""

    def __init__(self, host: str, port: int, backend: str, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.oai = backend != "sglang"
        self.local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.local.conn = conn
        return conn

    def request(self, prompt: str, prompt_len: int, output_len: int) -> Result:
        if self.oai:
            path = "/v1/completions"
            body = {
                "model": "default",
                "prompt": prompt,
                "max_tokens": output_len,
                "temperature": 0.0,
                "ignore_eos": True,
            }
        else:
            path = "/generate"
            body = {
                "text": prompt,
                "sampling_params": {
                    "max_new_tokens": output_len,
                    "temperature": 0.0,
                    "ignore_eos": True,
                },
            }
        start = time.perf_counter()
        try:
            conn = self._conn()
            conn.request(
                "POST",
                path,
                body=json.dumps(body),
                headers={"Content-Type": "application/json", BENCH_RUN_HEADER: RUN_NAME},
            )
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.local.conn = None
            return Result(False, prompt_len, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        latency = time.perf_counter() - start
        window = _window(resp.getheader(ENGINE_WINDOW_HEADER))
        if resp.status != 200:
            return Result(False, prompt_len, error=f"HTTP {resp.status} {resp.reason}")
        try:
            payload = json.loads(data)
        except ValueError:
            return Result(False, prompt_len, error="response is not JSON")
        if self.oai:
            out = int((payload.get("usage") or {}).get("completion_tokens", output_len))
            ttft = latency / max(out, 1)
        else:
            meta = payload.get("meta_info") or {}
            out = int(meta.get("completion_tokens", output_len))
            ttft = float(meta.get("ttft", latency / max(out, 1)))
        return Result(True, prompt_len, out, latency, min(ttft, latency), window=window)


def _window(text: str | None) -> tuple[float, float] | None:
    try:
        start, end = (float(x) for x in (text or "").split())
    except ValueError:
        return None
    return (start, end) if end >= start else None


def engine_busy(results: Sequence[Result]) -> float | None:
    """How long the engine was busy with `results` (the union of their
    ENGINE_WINDOW_HEADER windows: a gap while no request had reached it, a client slowed
    by a busy machine, is not counted), None unless every one of them has a window."""
    windows = sorted(r.window for r in results if r.window is not None)
    if not windows or len(windows) != len(results):
        return None
    busy, (start, end) = 0.0, windows[0]
    for a, b in windows[1:]:
        if a > end:
            busy, start = busy + end - start, a
        end = max(end, b)
    return busy + end - start


def _prompt(i: int, length: int) -> str:
    words = ("lab", "prompt", "about", "token", "throughput", "and", "latency", "of", "serving")
    return " ".join(words[(i + j) % len(words)] for j in range(max(length, 1)))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _row(label: str, value: object, fmt: str = "") -> str:
    if fmt:
        return "{:<40} {:<10{}}".format(label, value, fmt)
    return f"{label:<40} {value:<10}"


def report(args: argparse.Namespace, results: list[Result], duration: float) -> list[str]:
    """The result block, line by line, in bench_serving's layout."""
    ok = [r for r in results if r.ok]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    lat_ms = [r.latency * 1000 for r in ok]
    ttft_ms = [r.ttft * 1000 for r in ok]
    tpot_ms = [(r.latency - r.ttft) * 1000 / (r.output_len - 1) for r in ok if r.output_len > 1]
    dur = max(duration, 1e-9)
    concurrency = sum(r.latency for r in ok) / dur
    rate = "inf" if args.request_rate == float("inf") else args.request_rate
    lines = [
        "",
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        _row("Backend:", args.backend),
        _row("Traffic request rate:", rate),
        _row(
            "Max request concurrency:", args.max_concurrency if args.max_concurrency else "not set"
        ),
        _row("Successful requests:", len(ok)),
        _row("Benchmark duration (s):", duration, ".2f"),
        _row("Total input tokens:", total_in),
        _row("Total generated tokens:", total_out),
        _row("Total generated tokens (retokenized):", total_out),
        _row("Request throughput (req/s):", len(ok) / dur, ".2f"),
        _row("Input token throughput (tok/s):", total_in / dur, ".2f"),
        _row("Output token throughput (tok/s):", total_out / dur, ".2f"),
        _row("Total token throughput (tok/s):", (total_in + total_out) / dur, ".2f"),
        _row("Concurrency:", concurrency, ".2f"),
        "{s:{c}^{n}}".format(s="End-to-End Latency", n=50, c="-"),
        _row("Mean E2E Latency (ms):", statistics.fmean(lat_ms) if lat_ms else 0.0, ".2f"),
        _row("Median E2E Latency (ms):", statistics.median(lat_ms) if lat_ms else 0.0, ".2f"),
        "{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"),
        _row("Mean TTFT (ms):", statistics.fmean(ttft_ms) if ttft_ms else 0.0, ".2f"),
        _row("Median TTFT (ms):", statistics.median(ttft_ms) if ttft_ms else 0.0, ".2f"),
        _row("P99 TTFT (ms):", _pct(ttft_ms, 0.99), ".2f"),
        "{s:{c}^{n}}".format(s="Time per Output Token (excl. 1st token)", n=50, c="-"),
        _row("Mean TPOT (ms):", statistics.fmean(tpot_ms) if tpot_ms else 0.0, ".2f"),
        _row("Median TPOT (ms):", statistics.median(tpot_ms) if tpot_ms else 0.0, ".2f"),
        _row("P99 TPOT (ms):", _pct(tpot_ms, 0.99), ".2f"),
        "{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"),
        _row("Mean ITL (ms):", statistics.fmean(tpot_ms) if tpot_ms else 0.0, ".2f"),
        _row("Median ITL (ms):", statistics.median(tpot_ms) if tpot_ms else 0.0, ".2f"),
        _row("P95 ITL (ms):", _pct(tpot_ms, 0.95), ".2f"),
        _row("P99 ITL (ms):", _pct(tpot_ms, 0.99), ".2f"),
        _row("Max ITL (ms):", max(tpot_ms) if tpot_ms else 0.0, ".2f"),
        "=" * 50,
    ]
    return lines


def run(args: argparse.Namespace) -> int:
    host, port = args.host, args.port
    if args.base_url:
        rest = args.base_url.split("://", 1)[-1].rstrip("/")
        host, _, port_text = rest.partition(":")
        port = int(port_text) if port_text else 80
    client = Client(host, port, args.backend, args.timeout)
    n = args.num_prompts
    in_len, out_len = args.random_input_len, args.random_output_len
    print(f"#Input tokens: {n * in_len}")
    print(f"#Output tokens: {n * out_len}")
    if not args.disable_warmup:
        print("Starting initial single prompt test run...", flush=True)
        first = client.request(_prompt(0, in_len), in_len, min(out_len, 16))
        if not first.ok:
            print(
                f"Error: initial test run failed ({first.error}); is the server up at "
                f"{host}:{port}?",
                file=sys.stderr,
                flush=True,
            )
            return 1
        print("Initial test run completed. Starting main benchmark run...", flush=True)
    workers = min(args.max_concurrency or n, n, _MAX_THREADS)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        futures = [
            pool.submit(client.request, _prompt(i, in_len), in_len, out_len) for i in range(n)
        ]
        results = [f.result() for f in futures]
    duration = time.perf_counter() - start
    busy = engine_busy(results)
    duration = busy if busy is not None and busy > 0 else duration
    failed = [r for r in results if not r.ok]
    if failed:
        reasons = sorted({r.error for r in failed})
        print(
            f"Error: {len(failed)} of {n} requests failed; the server may have died "
            f"mid-run: {'; '.join(reasons[:3])}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print("\n".join(report(args, results, duration)), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if unknown:
        print(
            f"note: ignoring options the lab bench does not use: {' '.join(unknown)}",
            file=sys.stderr,
            flush=True,
        )
    if args.num_prompts < 1:
        parser.error("--num-prompts must be at least 1")
    if args.random_output_len < 1 or args.random_input_len < 1:
        parser.error("--random-input-len and --random-output-len must be at least 1")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error("--max-concurrency must be at least 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
