"""The real vLLM pairs (experiments/real/vllm-cpu/): what each bisection cost, and where.

Per pair (its campaigns in a results store): runs executed and reused, the answer, the
campaign's wall time; the server's start per phase, read from vLLM's OWN log markers and
timestamps (seconds after its first log line: the config resolved, the engine initialised,
the model loaded, the KV cache sized, the API server started); and the tool's overhead
against the server's start:

  server start        the run's start command to the first /health 200 (passing runs)
  in-run overhead     a passing run's end minus its first 200: the health confirmation,
                      the settle, fetching the log, stopping the server
  between runs        (wall - the executed runs' own durations) / executed runs: the
                      environment capture, the preflight (help read once per host and
                      build), lock, restore

A run the campaign reused from the store (`runs executed (reused)`) counts with the start
it reused: its phases and start time are that start's. The `real` test tier's store (its
subsets started first, the bisections reusing them) reads the same way.

    .venv/bin/python bench/real_vllm.py --results /tmp/real-results            # summarize
    .venv/bin/python bench/real_vllm.py --results DIR --run single_flag env_var  # bisect first

`--run` bisects the named pairs (bad file names; good is the pair's own good side) on
`--host` (default `lab`, from .lab/hosts.yaml: `orchestrator lab up --vllm` first), one at
a time: a vLLM start takes both cores of a 2-core machine.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.diagnosis.verdicts import Verdict  # noqa: E402
from orchestrator.store.store import RunRow, Store  # noqa: E402

REAL = REPO / "experiments" / "real" / "vllm-cpu"
#: bad side -> good side of each shipped pair
PAIRS = {
    "and_pair": "good",
    "single_flag": "good",
    "env_var": "good",
    "crash_under_load": "probe_good",
    "never_healthy": "good_short",
    "members_differ": "good",
    "alias_bad": "good",
    "hf_overrides_subkey": "hf_overrides_good",
}
#: vLLM's own markers, in start order (first line that contains the text)
MARKERS = (
    ("config", "Resolved architecture"),
    ("engine", "Initializing a V1 LLM engine"),
    ("load", "Starting to load model"),
    ("loaded", "Initializing model took"),
    ("kv_cache", "KV cache size"),
    ("engine_ready", "init engine (profile, create kv cache"),
    ("api", "Starting vLLM server on"),
)
_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")


def phases(log: str) -> dict[str, float]:
    """Marker -> seconds after the first timestamped line, by vLLM's own clock."""
    first: datetime | None = None
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = _STAMP.search(line)
        if not m:
            continue
        when = datetime.strptime(m[1], "%m-%d %H:%M:%S")
        first = first or when
        for name, text in MARKERS:
            if name not in out and text in line:
                out[name] = (when - first).total_seconds()
    return out


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def summarize(store: Store) -> list[str]:
    out = [
        "| pair | runs executed (reused) | answer | wall s | server start s | vLLM phases, s "
        "after its first log line (median of passing starts) | in-run overhead s | "
        "between runs s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for camp in sorted(store.campaigns(limit=500), key=lambda c: c.created):
        # a pair the real tier moved to its own port: `<pair>-bad.yaml`
        bad = Path(str(camp.spec.get("bad_source") or "")).stem.removesuffix("-bad")
        if camp.kind != "bisect" or bad not in PAIRS:
            continue
        runs: list[RunRow] = store.runs(camp.id)
        executed = [r for r in runs if r.cached_from is None]
        if not runs:
            continue
        # a reused run's start is the recorded one's: its phases and log are that run's
        starts = executed + [store.run(r.cached_from) for r in runs if r.cached_from]
        wall = camp.updated - camp.created
        passes = [r for r in starts if r.verdict is Verdict.PASS]
        ready = [r.phase_times["serving"] for r in passes if "serving" in r.phase_times]
        inrun = [
            r.duration - r.phase_times["serving"] for r in passes if "serving" in r.phase_times
        ]
        between = (wall - sum(r.duration for r in executed)) / max(len(executed), 1)
        per: dict[str, list[float]] = {}
        for r in passes:
            for name, t in phases(r.log_tail()).items():
                per.setdefault(name, []).append(t)
        marks = ", ".join(f"{n} {_med(per[n])}" for n, _ in MARKERS if n in per) or "-"
        answer = camp.answer or {}
        culprits = "; ".join(" + ".join(c.get("flags", [])) for c in answer.get("culprits", []))
        out.append(
            f"| {bad} | {len(executed)} ({len(runs) - len(executed)}) | "
            f"{culprits or camp.status} | {wall:.0f} | {_med(ready)} | {marks} | "
            f"{_med(inrun)} | {between:.1f} |"
        )
    return out


def run_pairs(names: list[str], results: Path, host: str, hosts: Path) -> None:
    for name in names:
        bad = name.removesuffix(".yaml")
        if bad not in PAIRS:
            raise SystemExit(f"real_vllm: no pair {bad!r}; pairs: {', '.join(PAIRS)}")
        t0 = time.monotonic()
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "bisect",
                "--good",
                str(REAL / f"{PAIRS[bad]}.yaml"),
                "--bad",
                str(REAL / f"{bad}.yaml"),
                "--host",
                host,
                "--hosts",
                str(hosts),
                "--results",
                str(results),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        print(f"{bad}: exit {res.returncode} in {time.monotonic() - t0:.0f}s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="the results store to read")
    p.add_argument(
        "--run",
        nargs="*",
        default=[],
        metavar="PAIR",
        help=f"bisect these pairs first ({', '.join(PAIRS)})",
    )
    p.add_argument("--host", default="lab")
    p.add_argument("--hosts", type=Path, default=REPO / ".lab" / "hosts.yaml")
    a = p.parse_args(argv)
    if a.run:
        run_pairs(a.run, a.results, a.host, a.hosts)
    store = Store(a.results)
    try:
        print("\n".join(summarize(store)))
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
