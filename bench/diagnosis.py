"""How far the classifier's signatures can be trusted on a folder of labelled real logs.

    .venv/bin/python bench/diagnosis.py [DIR ...] [--details] [--half heldout|tune|whole]
    .venv/bin/python bench/diagnosis.py --big [MB]      # speed on a huge non-server log

Without DIR it scores the project's two corpora side by side: tests/data/real_logs (reruns
of each bug made by a generator) and tests/data/thread_logs (reports of one bug by
different people in public issue threads, never generated).

DIR holds logs and a labels.tsv (file, class, phase, root_cause_key, source). Prints, for
the held-out half (split by root cause, see orchestrator.diagnosis.scoring.half_of), the tuning
half and the whole: pairwise precision and recall of signatures, the unclassified logs,
phase accuracy, against the targets; `--details` lists the colliding pairs (one signature,
two bugs), the split pairs (one bug, two signatures) and the wrong phases.

`--big` times `analyze_log` on non-server inputs (50 MB of repeated warnings, binary
bytes, empty text, a shell error): the answer must come in well under 2 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.diagnosis.classify.analyze import analyze_log  # noqa: E402
from orchestrator.diagnosis.scoring import TARGETS, Score, classify, load, score_halves  # noqa: E402

DEFAULT_CORPORA = ("tests/data/real_logs", "tests/data/thread_logs")


def table(scores: dict[str, Score]) -> str:
    rows = [("figure", *scores, "target")]
    get = {
        "logs": lambda s: str(s.logs),
        "root causes": lambda s: str(s.root_causes),
        "pairwise precision": lambda s: f"{s.precision:.3f}",
        "pairwise recall": lambda s: f"{s.recall:.3f}",
        "unclassified": lambda s: str(len(s.unclassified)),
        "phase right": lambda s: f"{s.phase_right}/{s.phase_counted} ({s.phase_accuracy:.0%})",
    }
    target = {
        "pairwise precision": f">= {TARGETS['precision']}",
        "pairwise recall": f">= {TARGETS['recall']}",
        "unclassified": str(TARGETS["unclassified"]),
        "phase right": f">= {TARGETS['phase_accuracy']:.0%}",
    }
    for name, fn in get.items():
        rows.append((name, *(fn(s) for s in scores.values()), target.get(name, "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def details(s: Score) -> str:
    out = []
    for a, b, sig in s.collisions:
        out.append(f"collide  {a}  {b}\n         {sig}")
    for a, b, sa, sb in s.splits:
        out.append(f"split    {a}  {b}\n         {sa}\n         {sb}")
    for f, want, got in s.wrong_phase:
        out.append(f"phase    {f}: labelled {want}, classified {got}")
    out += [f"unclassified  {f}" for f in s.unclassified]
    return "\n".join(out) or "(nothing wrong)"


def big(mb: int) -> None:
    warning = (
        b"/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:61: "
        b"FutureWarning: The pynvml package is deprecated. Please install "
        b"nvidia-ml-py instead.\n"
    )
    inputs = {
        f"{mb} MB of warnings": (warning * (mb * 1024 * 1024 // len(warning))).decode(),
        f"{mb} MB of binary": os.urandom(mb * 1024 * 1024).decode("utf-8", errors="replace"),
        "empty": "",
        "shell error": "bash: line 1: /opt/sglang/bin/python: No such file or directory\n",
    }
    print("| input | seconds | answer |\n|---|---|---|")
    for name, text in inputs.items():
        t0 = time.perf_counter()
        analysis = analyze_log(text)
        dt = time.perf_counter() - t0
        answer = str(analysis.signature) if analysis.signature else (analysis.note or "no failure")
        print(f"| {name} | {dt:.3f} | {answer[:70]} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folders",
        nargs="*",
        metavar="DIR",
        help="folders with logs and labels.tsv (default: both corpora)",
    )
    parser.add_argument("--details", action="store_true", help="list the pairs that went wrong")
    parser.add_argument(
        "--half",
        choices=["heldout", "tune", "whole"],
        default=None,
        help="details for this part only (default: both halves)",
    )
    parser.add_argument(
        "--big",
        type=int,
        nargs="?",
        const=50,
        metavar="MB",
        help="time analyze_log on huge and non-server inputs",
    )
    args = parser.parse_args(argv)
    if args.big:
        big(args.big)
        return 0
    root = Path(__file__).resolve().parents[1]
    folders = args.folders or [str(root / f) for f in DEFAULT_CORPORA]
    per_folder = {f: score_halves(classify(load(f))) for f in folders}
    if len(per_folder) == 1:
        scores = next(iter(per_folder.values()))
        print(table(scores))
    else:
        # the held-out half and the whole of every corpus, side by side
        columns = {
            f"{Path(f).name} {half}": s[half]
            for f, s in per_folder.items()
            for half in ("heldout", "whole")
        }
        print(table(columns))
    if args.details:
        for f, scores in per_folder.items():
            for name, s in scores.items():
                if args.half == name or (args.half is None and name != "whole"):
                    print(f"\n## {Path(f).name} {name}\n{details(s)}")
    return (
        0
        if all(
            s["heldout"].meets_targets() and s["whole"].meets_targets() for s in per_folder.values()
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
