"""Command line: wires the layers together and is the only place that prints.

Each subcommand lives in its own module under `orchestrator.cli` and exposes
`register(subparsers)`; the module's handler returns an exit code. Errors from the
core arrive as `OrchestratorError`s and are shown as one line (plus a hint); `-v`
adds the traceback. Exit codes (docs/verdicts.md): 0 found/done, 1 campaign did not
conclude, 2 usage or config error, 3 infrastructure error, 4 a bisection's best answer is
below the confidence asked (`unsure`), 5 a sweep finished with a regression,
130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

from orchestrator import __version__
from orchestrator.errors import OrchestratorError


class _Parser(argparse.ArgumentParser):
    last_error: str | None = None

    def error(self, message: str) -> None:  # argparse's default exits 2 too; keep its wording
        _Parser.last_error = f"{self.prog}: {message}"
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


#: the module of each command, for loading only the one a command line names
_MODULE_OF = {
    "plan": "plan",
    "bisect": "bisect",
    "run": "run",
    "rerun": "run",
    "sweep": "sweep",
    "runs": "runs",
    "show": "runs",
    "report": "report",
    "classify": "classify",
    "import": "import_",
    "hosts": "hosts",
    "restore": "restore",
    "lab": "lab",
    "schedule": "schedule",
}
#: the command modules, in the order `--help` lists their commands (a module missing from
#: a checkout is skipped, so the CLI grows with the product)
COMMAND_MODULES = tuple(dict.fromkeys(_MODULE_OF.values()))


def _named_module(argv: Sequence[str]) -> str | None:
    """The module of the command `argv` names (its first word that is not an option), or
    None when it names none we know: then every command is loaded, for help and errors."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return _MODULE_OF.get(word) if word is not None else None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the named command's module is imported (each command
    module pulls in its part of the package: `runs` need not load the executor)."""
    parser = _Parser(
        prog="orchestrator",
        description="Find which server flag breaks an inference deployment.",
    )
    parser.add_argument("--version", action="version", version=f"orchestrator {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show tracebacks and debug detail"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    only = _named_module(argv) if argv is not None else None
    for name in COMMAND_MODULES:
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(f"orchestrator.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"orchestrator.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[: argv.index("--")] if "--" in argv else argv)
    # Everything after the first `--` is a command line given to a subcommand (`import --
    # CMD`, `schedule add NAME --at ... -- sweep FILE`), not options for us: argparse's
    # subparsers do not handle `--` well, so it is split off here.
    rest: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 2 and "--json" in argv:  # with --json, stdout is one JSON document
            _json_error(_Parser.last_error or "usage error", "see --help", 2)
        raise
    if rest is not None:
        if not hasattr(args, "command_words"):
            parser.error("'--' is only used by `import` and `schedule add`")
        args.command_words = rest
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    as_json = bool(getattr(args, "json", False))
    args.argv = argv + (["--", *rest] if rest is not None else [])  # for --detach
    code = 1  # an unexpected error's traceback: Python's exit status
    try:
        code = _handle(args, as_json)
        return code
    finally:
        from orchestrator.cli.common import record_exit

        record_exit(args, code)


def _handle(args: argparse.Namespace, as_json: bool) -> int:
    from orchestrator.cli.output import err_console

    try:
        return int(args.handler(args) or 0)
    except OrchestratorError as exc:
        if args.verbose:
            traceback.print_exc()
        from orchestrator.cli.common import with_hosts_file

        message = with_hosts_file(args, exc)
        if as_json:  # with --json, stdout is always one JSON document
            _json_error(message, exc.hint, exc.exit_code)
        from rich.markup import escape

        err_console().print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
        if exc.hint:
            err_console().print(
                f"  [yellow]hint:[/] {escape(exc.hint)}", markup=True, highlight=False
            )
        return exc.exit_code
    except KeyboardInterrupt:
        if as_json:
            _json_error("interrupted", None, 130)
        err_console().print("interrupted", highlight=False)
        return 130


def _json_error(message: str, hint: str | None, code: int) -> None:
    import json

    from orchestrator.cli.output import console

    console().print_json(
        json.dumps({"status": "error", "error": message, "hint": hint, "exit_code": code})
    )
