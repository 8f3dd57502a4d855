"""The truth fuzzer on demand: N generated lab incidents bisected through the real CLI on
the process lab host (the project's private sshd), each answer compared with the oracle's,
then a table by feature combination (see docs/fuzz.md).

    .venv/bin/python bench/fuzz.py --incidents 50 [--first 1000] [--log fuzz.jsonl]
    .venv/bin/python bench/fuzz.py --table fuzz.jsonl        # the table of a saved log
    .venv/bin/python bench/fuzz.py --seeds 5,17 --shrink     # shrink and keep wrong ones

Seeds are `first` .. `first + N - 1`; an incident is a pure function of its seed. Every
incident's outcome is appended to the log (JSON lines) as it ends, so a long run that is
stopped keeps what it did. With `--shrink` each wrong answer is shrunk and saved as a
regression case under tests/data/fuzz/ (the suite replays it). One fuzz process at a
time: each bisection starts lab servers on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.fuzz import cases, generate, runner, shrink  # noqa: E402

KINDS = ("right", "unsure", "unconcluded", "wrong", "skipped")


def group(features: list[str]) -> str:
    """The table's row of an incident: its failure, its cause, flaky, decoys, a path."""
    kind = next(f for f in features if f in ("crash", "hang", "load", "answers"))
    cause = next(f for f in features if f in ("single", "interacting", "independent"))
    extra = [f for f in ("flaky", "decoy", "path") if f in features]
    return " + ".join([f"{kind}, {cause}", *extra])


def table(rows: list[dict[str, Any]]) -> str:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        # the features as the generator draws them now (a saved log may predate a feature)
        r["features"] = list(generate.incident(r["seed"]).features)
        by[group(r["features"])].append(r)
    lines = [
        "| incidents of | n | right | unsure | not concluded | wrong | runs per answer"
        " | s per incident |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in [*sorted(by), "all"]:
        rs = rows if name == "all" else by[name]
        count = {k: sum(1 for r in rs if r["kind"] == k) for k in KINDS}
        answered = [r["runs"] for r in rs if r["kind"] == "right"]
        per = f"{sum(answered) / len(answered):.1f}" if answered else "-"
        secs = sum(r["seconds"] for r in rs) / len(rs)
        label = f"**{name}**" if name == "all" else name
        lines.append(
            f"| {label} | {len(rs)} | {count['right']} | {count['unsure']} | "
            f"{count['unconcluded']} | {count['wrong']} | {per} | {secs:.0f} |"
        )
    return "\n".join(lines)


def record(res: runner.Result) -> dict[str, Any]:
    return {
        "seed": res.incident.seed,
        "features": list(res.incident.features),
        "deltas": len(res.incident.deltas),
        "kind": res.kind,
        "status": res.status,
        "exit": res.exit_code,
        "confidence": res.confidence,
        "runs": res.runs,
        "seconds": round(res.seconds, 1),
        "problems": res.problems,
        "expected": res.expected,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--incidents", type=int, default=20)
    ap.add_argument("--first", type=int, default=1, help="the first seed")
    ap.add_argument("--seeds", help="a comma-separated list of seeds instead")
    ap.add_argument("--log", type=Path, help="append each outcome to this JSON-lines file")
    ap.add_argument("--table", type=Path, help="print the table of a saved log and stop")
    ap.add_argument("--shrink", action="store_true", help="shrink and keep wrong answers")
    args = ap.parse_args()
    if args.table:
        rows = [json.loads(x) for x in args.table.read_text().splitlines() if x.strip()]
        print(table(rows))
        return 0
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else list(range(args.first, args.first + args.incidents))
    )
    rows = []
    with runner.private_sshd() as sshd, tempfile.TemporaryDirectory(prefix="orch-fuzz-") as d:
        for seed in seeds:
            res = runner.run(generate.incident(seed), sshd, Path(d) / str(seed))
            row = record(res)
            rows.append(row)
            print(res.summary(), flush=True)
            if args.log:
                with args.log.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
            if res.wrong and args.shrink:
                small = shrink.shrink(res, sshd, Path(d) / f"{seed}-shrink")
                path = cases.save(small, REPO / "tests" / "data" / "fuzz")
                print(f"  shrunk to {len(small.incident.deltas)} deltas: {path}", flush=True)
    print(table(rows))
    return 1 if any(r["kind"] == "wrong" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
