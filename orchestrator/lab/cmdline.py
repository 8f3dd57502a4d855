"""The simulated server's command line: SGLang-style flags, parsed strictly or permissively.

With a scenario's `known_flags`, a real `argparse` parser is built (`allow_abbrev=True`,
prog `launch_server.py`) so `--help`, unrecognized and ambiguous options behave exactly as
the real server's do. Without them any `--flag [VALUE ...]` is accepted: a flag followed by
another `--x` or by the end is a switch. Either way the result is a dict of canonical flag
name (no dashes) -> True / number / string / list.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.lab import flags as flagcat
from orchestrator.lab.scenario_model import LAB_ONLY_FLAGS, coerce

PROG = "launch_server.py"
#: Flags the simulation always accepts, whatever the scenario lists.
ALWAYS = (
    flagcat.FlagSpec("host", help="The host of the HTTP server."),
    flagcat.FlagSpec("port", help="The port of the HTTP server."),
    flagcat.FlagSpec(
        "tp-size", aliases=("tensor-parallel-size",), help="The tensor parallelism size."
    ),
)


class UsageError(Exception):
    """A command line the permissive parser cannot read; message in argparse's words."""


@dataclass(frozen=True)
class Pre:
    """The lab's own flags, read before the scenario (which decides how to parse the rest)."""

    scenario: str | None
    seed: str | None
    time_scale: str | None


def prescan(argv: Sequence[str]) -> Pre:
    found: dict[str, str | None] = dict.fromkeys(LAB_ONLY_FLAGS)
    i = 0
    while i < len(argv):
        tok = argv[i]
        for name in LAB_ONLY_FLAGS:
            if tok == f"--{name}" and i + 1 < len(argv):
                found[name] = argv[i + 1]
                i += 1
            elif tok.startswith(f"--{name}="):
                found[name] = tok.split("=", 1)[1]
        i += 1
    return Pre(found["scenario"], found["seed"], found["time-scale"])


def wants_help(argv: Sequence[str]) -> bool:
    return any(tok in ("-h", "--help") for tok in argv)


def build_parser(specs: Sequence[flagcat.FlagSpec] | None) -> argparse.ArgumentParser:
    """An argparse parser for the given flags plus the lab's and the always-accepted ones."""
    epilog = None
    if specs is None:
        epilog = "This scenario lists no known_flags: any --flag [VALUE ...] is accepted."
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=True, epilog=epilog)
    names: set[str] = set()
    for spec in [*(specs or ()), *ALWAYS]:
        if spec.name in names:
            continue
        names.add(spec.name)
        opts = [f"--{spec.name}", *(f"--{a}" for a in spec.aliases)]
        kw: dict[str, object] = {"dest": spec.name, "default": argparse.SUPPRESS}
        if spec.help:
            kw["help"] = spec.help
        if spec.kind == flagcat.SWITCH:
            kw["action"] = "store_true"
        else:
            kw["metavar"] = spec.name.upper().replace("-", "_").replace(".", "_")
            if spec.kind == flagcat.LIST:
                kw["nargs"] = "+"
        parser.add_argument(*opts, **kw)
    # The lab's own flags are no part of the simulated server: hidden from --help.
    for name in LAB_ONLY_FLAGS:
        parser.add_argument(
            f"--{name}", dest=name, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return parser


def parse_strict(argv: Sequence[str], specs: Sequence[flagcat.FlagSpec]) -> dict[str, object]:
    """Parse like the real server; argparse itself prints and exits 2 on a bad command line."""
    ns = build_parser(specs).parse_args(list(argv))
    return {name: _value(v) for name, v in vars(ns).items()}


def parse_permissive(argv: Sequence[str]) -> dict[str, object]:
    """Accept any `--flag [VALUE ...]`; raises UsageError for a stray positional word."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise UsageError(f"unrecognized arguments: {' '.join(argv[i:])}")
        name, eq, inline = tok[2:].partition("=")
        values: list[str] = [inline] if eq else []
        i += 1
        if not eq:
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
        key = flagcat.canonical(name)
        if not values:
            out[key] = True
        elif len(values) == 1:
            out[key] = values[0]
        else:
            out[key] = values
    return {k: _value(v) for k, v in out.items()}


def print_usage_error(message: str, specs: Sequence[flagcat.FlagSpec] | None) -> None:
    """argparse's error layout (usage, then `prog: error: ...`) on stderr."""
    parser = build_parser(specs)
    parser.print_usage(sys.stderr)
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.stderr.flush()


def _value(v: object) -> object:
    if v is True:
        return True
    if isinstance(v, list):
        return [coerce(str(x)) for x in v]
    return coerce(str(v))
