"""Record a server's real `--help` text and the option strings its real parser accepts.

Run in a scratch virtualenv holding the server package (see README.md beside this file),
never by the test suite:

    python record_help.py sglang OUTDIR     # SGLang: ServerArgs.add_cli_args, prog "sglang serve"
    python record_help.py vllm OUTDIR       # vLLM: `vllm serve`, paged help and --help=all

Writes OUTDIR/<name>.help.txt (and .help-all.txt for vLLM) exactly as the parser prints it
at 80 columns, and OUTDIR/<name>.accepts.json: every option string registered with the
parser (hidden ones included, marked), every other spelling tried (underscore, dotted,
`-O3`) and the preflight's dry parse of every option, each with the real parser's own
decision, so tests can compare the preflight's decisions with the real parser's without
the package installed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["COLUMNS"] = "80"  # what argparse sees over a non-interactive SSH session
REFUSING = ("unrecognized arguments", "ambiguous option")
PROBE = "--orchestrator-preflight-probe"  # orchestrator.execution.preflight.PROBE


def _outcome(parse: Callable[[list[str]], Any], argv: list[str]) -> str:
    """'ok', or the first line of the parser's error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            return "ok"
        lines = [ln for ln in err.getvalue().splitlines() if ": error: " in ln]
        return lines[0].split(": error: ", 1)[1] if lines else f"exit {exc.code}"
    except Exception as exc:  # a type function that raises something else
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _values(action: argparse.Action) -> list[list[str]]:
    if action.nargs == 0:
        return [[]]
    if action.choices:
        return [[str(next(iter(action.choices)))]]
    return [["1"], ["3"], ["auto"], ["x"], ['{"a": 1}']]


def _survey(
    parser: argparse.ArgumentParser,
    parse: Callable[[list[str]], Any],
    prefix: list[str],
    extra_forms: list[str],
) -> dict[str, Any]:
    actions = parser._option_string_actions  # noqa: SLF001 (the parser's own registry)
    options = []
    for opt, action in actions.items():
        if opt in ("-h", "--help"):
            continue
        options.append(
            {
                "option": opt,
                "dest": action.dest,
                "switch": action.nargs == 0,
                "hidden": action.help == argparse.SUPPRESS,
            }
        )
    forms: dict[str, str] = {}
    candidates: list[tuple[str, argparse.Action | None]] = []
    for opt, action in actions.items():
        if not opt.startswith("--") or opt == "--help":
            continue
        name = opt[2:]
        if "-" in name:
            candidates.append(("--" + name.replace("-", "_"), action))
        candidates.append((opt + ".level", None))
    candidates += [(f, None) for f in extra_forms]
    for form, action in candidates:
        tries = _values(action) if action is not None else [["3"], ['{"a": 1}'], ["1"]]
        if form.startswith("-O") and not form.startswith("--"):
            tries = [[]]
        result = ""
        for values in tries:
            result = _outcome(parse, [*prefix, form, *values])
            if result == "ok":
                break
        forms[form] = result
    # The preflight's dry parse of each option: the option (with a value it takes) plus an
    # unknown flag. A parser that takes the option names only the unknown flag.
    dry: dict[str, str] = {}
    for opt, action in actions.items():
        if opt in ("-h", "--help"):
            continue
        result = ""
        for values in _values(action):
            result = _outcome(parse, [*prefix, opt, *values, PROBE])
            if result == f"unrecognized arguments: {PROBE}":
                break
        dry[opt] = result
    return {
        "allow_abbrev": parser.allow_abbrev,
        "dry_parse": dry,
        "python": ".".join(map(str, sys.version_info[:3])),
        "options": options,
        "forms": forms,
    }


def record_sglang(out: Path) -> None:
    import stub_heavy_imports

    stub_heavy_imports.install(
        ["torch", "triton", "transformers", "zmq", "tqdm", "IPython", "aiohttp"]
    )
    import sglang
    from sglang.srt.server_args import ServerArgs

    # As sglang.srt.server_args.prepare_server_args builds it for `python -m
    # sglang.launch_server` and `sglang serve`.
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    name = f"sglang-{sglang.__version__}"
    (out / f"{name}.help.txt").write_text(parser.format_help())
    # seed 002: --cuda-graph-max-bs split into -decode/-prefill in this release
    survey = _survey(
        parser,
        parser.parse_args,
        ["--model-path", "m"],
        ["-O3", "--cuda-graph-max-bs", "--cuda-graph"],
    )
    survey["program"] = f"python -m sglang.launch_server (sglang {sglang.__version__})"
    (out / f"{name}.accepts.json").write_text(json.dumps(survey, indent=1) + "\n")


def record_vllm(out: Path) -> None:
    import stub_heavy_imports

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    stub_heavy_imports.install(
        [
            "torch",
            "triton",
            "openai_harmony",
            "uvloop",
            "xgrammar",
            "llguidance",
            "watchfiles",
            "vllm.ir",
        ]
    )
    import importlib.metadata

    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.entrypoints.common.startup import VLLM_SUBCMD_PARSER_EPILOG
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    version = importlib.metadata.version("vllm")
    # As vllm/entrypoints/cli/main.py and cli/serve.py build it (the other subcommands'
    # modules import the GPU runtime and are left out: they do not change `serve`).
    sys.argv[0] = "vllm"
    top = FlexibleArgumentParser(
        description="vLLM CLI", epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]")
    )
    top.add_argument("-v", "--version", action="version", version=version)
    subparsers = top.add_subparsers(required=False, dest="subparser")
    import vllm.entrypoints.cli.serve as serve_mod  # noqa: F401 (DESCRIPTION)

    serve = subparsers.add_parser(
        "serve",
        help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
        description=serve_mod.DESCRIPTION,
        usage="vllm serve [model_tag] [options]",
    )
    serve = make_arg_parser(serve)
    serve.epilog = VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="serve")

    def text_of(argv: list[str]) -> str:
        FlexibleArgumentParser._search_keyword = None  # noqa: SLF001 (class-level state)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            top.parse_args(argv)
        return buf.getvalue()

    name = f"vllm-{version}-serve"
    (out / f"{name}.help.txt").write_text(text_of(["serve", "--help"]))
    (out / f"{name}.help-all.txt").write_text(text_of(["serve", "--help=all"]))

    def parse(argv: list[str]) -> Any:
        FlexibleArgumentParser._search_keyword = None  # noqa: SLF001
        return top.parse_args(argv)

    survey = _survey(serve, parse, ["serve", "Qwen/Qwen3-0.6B"], ["-O3", "-O0", "-O=2"])
    survey["program"] = f"vllm serve (vllm {version})"
    (out / f"{name}.accepts.json").write_text(json.dumps(survey, indent=1) + "\n")


if __name__ == "__main__":
    which, outdir = sys.argv[1], Path(sys.argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    {"sglang": record_sglang, "vllm": record_vllm}[which](outdir)
