"""`orchestrator classify LOGFILE|-`: name the failure in any saved server log.

Prints the phase the server reached, the error class, the signature and the key excerpt,
the same way a run's verdict names them, so a crash from a manual run can be compared
with recorded runs. `--json` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from orchestrator.classify import LogAnalysis, analyze_log
from orchestrator.cli.output import console
from orchestrator.errors import UsageError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="name the failure (phase, error class, signature) in a saved server log",
        description="Classify a saved SGLang/vLLM log: phase reached, error class, signature.",
    )
    parser.add_argument("logfile", metavar="LOGFILE|-", help="a saved log, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def read_log(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    path = Path(name)
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise UsageError(
            f"{name}: no such file", hint="give a saved log file, or - for stdin"
        ) from None
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, not a log file") from None
    except PermissionError:
        raise UsageError(f"{name}: permission denied") from None


def as_dict(analysis: LogAnalysis) -> dict[str, Any]:
    sig = analysis.signature
    return {
        "failed": analysis.failed,
        "phase": analysis.phase.value if analysis.phase else None,
        "reached": analysis.reached.value if analysis.reached else None,
        "error_class": analysis.error_class,
        "message": analysis.message,
        "raw_message": analysis.raw_message,
        "signature": sig.key() if sig else None,
        "excerpt": list(analysis.excerpt),
    }


def render(analysis: LogAnalysis) -> None:
    out = console()
    phase = analysis.phase.value if analysis.phase else "unknown (no startup milestone seen)"
    if analysis.signature is None:
        out.print(f"[bold green]no failure found[/]; phase reached: {escape(phase)}")
        return
    out.print(f"[bold]phase[/]        {escape(phase)}")
    out.print(f"[bold]error class[/]  {escape(analysis.error_class or '')}")
    out.print(f"[bold]signature[/]    {escape(str(analysis.signature))}")
    if analysis.excerpt:
        out.print("[bold]excerpt[/]")
        for line in analysis.excerpt:
            out.print(f"  {escape(line)}", highlight=False)


def run(args: argparse.Namespace) -> int:
    analysis = analyze_log(read_log(args.logfile))
    # Hook: listing the recorded runs that share this signature belongs here, once the
    # store can be queried by `analysis.signature.key()` (the same key it stores).
    if args.json:
        console().print_json(json.dumps(as_dict(analysis)))
    else:
        render(analysis)
    return 0
