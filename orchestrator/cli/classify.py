"""`orchestrator classify LOGFILE|-`: name the failure in any saved server log.

Prints the phase the server reached, the error class, the signature and the key excerpt,
the same way a run's verdict names them, so a crash from a manual run can be compared
with recorded runs. `--json` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, BinaryIO

from rich.markup import escape

from orchestrator.cli import common
from orchestrator.cli.output import console
from orchestrator.diagnosis.classify.analyze import LogAnalysis, analyze_log
from orchestrator.diagnosis.classify.judge import port_clash
from orchestrator.errors import UsageError
from orchestrator.store.store import RunRow, Store


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="name the failure (phase, error class, signature) in a saved server log",
        description="Classify a saved SGLang/vLLM log: phase reached, error class, signature.",
    )
    parser.add_argument("logfile", metavar="LOGFILE|-", help="a saved log, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    common.add_results_option(parser)
    parser.set_defaults(handler=run)


#: what is classified of a log: its tail, as runs keep theirs (a crash is at the end)
TAIL_BYTES = 4 * 1024 * 1024
#: how much of a stream (stdin, a device) is read at most to find that tail
STREAM_LIMIT = 256 * 1024 * 1024


def read_log(name: str) -> str:
    """The last TAIL_BYTES of a saved log (or stdin), as text; refuses binary data."""
    try:
        if name == "-":
            data = _stream_tail(sys.stdin.buffer, name)
        else:
            path = Path(name)
            with path.open("rb") as fh:
                if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    size = os.fstat(fh.fileno()).st_size
                    fh.seek(max(size - TAIL_BYTES, 0))
                    data = fh.read(TAIL_BYTES)
                else:
                    data = _stream_tail(fh, name)
    except FileNotFoundError:
        raise UsageError(
            f"{name}: no such file", hint="give a saved log file, or - for stdin"
        ) from None
    except IsADirectoryError:
        raise UsageError(f"{name}: is a directory, not a log file") from None
    except PermissionError:
        raise UsageError(f"{name}: permission denied") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if data and data.count(0) > len(data) // 100:
        raise UsageError(
            f"{name}: binary data, not a server log",
            hint="give the text log the server wrote (journalctl -u UNIT, or its log file)",
        )
    return data.decode("utf-8", errors="replace")


def _stream_tail(fh: BinaryIO, name: str) -> bytes:
    """The last TAIL_BYTES of a stream, reading at most STREAM_LIMIT (a device such as
    /dev/zero never ends)."""
    tail = b""
    total = 0
    while total < STREAM_LIMIT:
        chunk = fh.read(1024 * 1024)
        if not chunk:
            return tail
        total += len(chunk)
        if chunk.count(0) > len(chunk) // 100:
            return chunk  # binary: refused by the caller, no need to read on
        tail = (tail + chunk)[-TAIL_BYTES:]
    raise UsageError(
        f"{name}: more than {STREAM_LIMIT // 2**20} MiB and still going; not a saved log",
        hint="save the log to a file, or pipe its tail (tail -c 4M)",
    )


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
        "site": analysis.site,
        "kind": analysis.kind,
        "server": analysis.server,
        "note": analysis.note,
        "excerpt": list(analysis.excerpt),
    }


def render(analysis: LogAnalysis, trouble: str | None = None) -> None:
    out = console()
    phase = analysis.phase.value if analysis.phase else "unknown (no startup milestone seen)"
    if trouble is not None:
        out.print(
            f"[bold yellow]host trouble[/]: {escape(trouble)}; a run that ends like this "
            "is infra (retried, never a verdict)",
            highlight=False,
        )
        return
    if analysis.signature is None:
        if analysis.note:
            out.print(f"[bold yellow]{escape(analysis.note)}[/]")
            return
        out.print(f"[bold green]no failure found[/]; phase reached: {escape(phase)}")
        return
    out.print(f"[bold]phase[/]        {escape(phase)}")
    out.print(f"[bold]error class[/]  {escape(analysis.error_class or '')}")
    out.print(f"[bold]signature[/]    {escape(str(analysis.signature))}")
    if analysis.excerpt:
        out.print("[bold]excerpt[/]")
        for line in analysis.excerpt:
            out.print(f"  {escape(line)}", highlight=False)


def seen_before(analysis: LogAnalysis, results: str) -> list[RunRow]:
    """Recorded runs with the same signature ("have we seen this crash, with which flags?")."""
    if analysis.signature is None or not (Path(results) / "orchestrator.db").exists():
        return []
    store = Store(results, readonly=True)
    try:
        # an older store (not yet re-signed, and read-only here) is matched in memory
        return store.runs_with_signature(analysis.signature)
    finally:
        store.close()


def run(args: argparse.Namespace) -> int:
    text = read_log(args.logfile)
    analysis = analyze_log(text)
    trouble = port_clash(text)
    matches = seen_before(analysis, args.results)
    if args.json:
        data = as_dict(analysis) | {
            "host_trouble": trouble,
            "seen_in_runs": [
                {
                    "run": r.id,
                    "campaign": r.campaign,
                    "host": r.host,
                    "variant": r.label,
                    "argv": r.argv,
                }
                for r in matches
            ],
        }
        console().print_json(json.dumps(data))
        return 0
    render(analysis, trouble)
    if analysis.signature is not None and trouble is None:
        out = console()
        if matches:
            out.print(f"[bold]seen before[/] in {len(matches)} recorded run(s):")
            for r in matches[-10:]:
                out.print(f"  {r.id} on {escape(r.host)}: {escape(r.label)}", highlight=False)
                out.print(f"    {escape(' '.join(r.argv))}", highlight=False)
        else:
            out.print("[dim]not seen in any recorded run[/]")
    return 0
