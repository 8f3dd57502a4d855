"""`orchestrator import SOURCE`: a systemd unit, a launch script or a command line -> YAML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.markup import escape

from orchestrator.cli.output import console, err_console
from orchestrator.config.importer import (
    import_command_line,
    import_file,
    render_yaml,
    secret_references,
    to_experiment_mapping,
)
from orchestrator.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        usage="orchestrator import [--name N] [-o OUT] (SOURCE | - | -- COMMAND LINE...)",
        help="turn a systemd unit, launch script or command line into an experiment YAML",
        description=(
            "Read a systemd unit file (ExecStart=, Environment=), a shell launch script, or a "
            "command line given after --, as systemd and the shell would read it, and print "
            "(or write) the experiment YAML; what cannot be read is refused, naming it."
        ),
    )
    p.add_argument("source", nargs="?", help="unit file or script; '-' reads stdin")
    p.add_argument("--name", help="experiment name (default: the source's file name)")
    p.add_argument("-o", "--output", help="write the YAML here instead of printing it")
    p.set_defaults(handler=run, command_words=[])


def run(args: argparse.Namespace) -> int:
    words = list(args.command_words)
    if args.source and args.source != "-" and not words:
        spec = import_file(args.source)
        default_name = Path(args.source).stem
    elif words or (args.source and args.source != "-"):
        import shlex

        line = shlex.join(([args.source] if args.source else []) + words)
        spec = import_command_line(line)
        default_name = "imported"
    elif args.source == "-":
        spec = import_command_line(sys.stdin.read(), source="<stdin>")
        default_name = "imported"
    else:
        raise UsageError(
            "nothing to import", hint="give a unit file, a script, '-' for stdin, or -- COMMAND"
        )
    hidden = secret_references(spec)
    mapping = to_experiment_mapping(spec, name=args.name or default_name)
    text = render_yaml(mapping)
    for note in spec.get("notes") or []:
        err_console().print(f"note: {escape(note)}", highlight=False)
    if "port" not in spec["flags"]:
        err_console().print(
            "note: the command has no --port; add service.flags.port (or health.port) before "
            "using this config: the health port is never guessed",
            highlight=False,
        )
    if hidden:
        err_console().print(
            "note: secret values were replaced by references: "
            + ", ".join(f"${{{n}}}" for n in hidden)
            + "; export them before running (they are never stored)",
            highlight=False,
        )
    if args.output:
        out = Path(args.output)
        if out.exists():
            raise UsageError(f"{out} exists; not overwriting it", hint="choose another -o path")
        out.write_text(text)
        console().print(f"wrote {out}", highlight=False)
    else:
        sys.stdout.write(text)
    return 0
