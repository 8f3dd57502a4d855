"""The flag preflight (orchestrator.execution.preflight): help texts printed by the real
programs, and the real programs themselves run on this machine.

Recorded data (tests/data/help, README there): SGLang 0.5.23's help and vLLM 0.33.0's paged
help and `--help=all`, each with the option strings its real parser registers and that
parser's own decision on other spellings (underscore, dotted, -O3), a pass-through wrapper,
the lab server of a scenario without known_flags, and a script with no help at all.

What is proved here: on every recorded help no flag the real parser accepts is refused
(`test_zero_false_refusals`, the table is printed with -s); the help is trusted to predict
only when it is complete; vLLM's pointer to --help=all is followed and its spellings
accepted; predictions agree with argparse run on the same option strings; a predicted
refusal is confirmed by the server's own parser (a dry parse that starts nothing) or
withdrawn, and a withdrawn trust is said once.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.execution.preflight import (
    PROBE,
    Check,
    HelpFacts,
    Preflight,
    _without_probe,
    follow,
    normalize,
    parser_error,
    predict,
    read_help,
)
from orchestrator.execution.transport.local import LocalTransport

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "help"
LAB = REPO / "experiments" / "lab"
REFUSING = ("unrecognized arguments", "ambiguous option")

#: recorded help of a real parser -> (first page, the page its pointer prints)
RECORDED = {
    "sglang-0.5.23": ("sglang-0.5.23.help.txt", None),
    "vllm-0.33.0-serve": ("vllm-0.33.0-serve.help.txt", "vllm-0.33.0-serve.help-all.txt"),
}


def facts_of(name: str) -> HelpFacts:
    first, full = RECORDED[name]
    facts = read_help((DATA / first).read_text())
    if full is not None:
        assert facts.more == "--help=all"
        facts = follow(facts, read_help((DATA / full).read_text()))
    return facts


def accepts(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.accepts.json").read_text())


def taken_by_the_real_parser(name: str) -> tuple[list[str], list[str]]:
    """(every option string the parser registers, every other spelling it takes).

    An underscore spelling is taken when the parser recognises the option (a value it
    rejects is no refusal of the flag); a dotted or -O spelling when the whole command line
    parsed (the dotted form of a plain option is a JSON value the option refuses)."""
    data = accepts(name)
    options = [o["option"] for o in data["options"]]
    forms = []
    for form, outcome in data["forms"].items():
        dotted_or_o = "." in form or not form.startswith("--")
        if outcome == "ok" or (not dotted_or_o and not outcome.startswith(REFUSING)):
            forms.append(form)
    return options, forms


# ---------------------------------------------------------------------------- reading helps


def test_sglang_help_is_complete_and_lists_every_visible_option() -> None:
    facts = facts_of("sglang-0.5.23")
    assert facts.complete and not facts.flexible and not facts.passthrough
    visible = {o["option"] for o in accepts("sglang-0.5.23")["options"] if not o["hidden"]}
    assert set(facts.options) - {"-h", "--help"} == visible


def test_vllm_paged_help_points_to_help_all_and_is_not_trusted_alone() -> None:
    first = read_help((DATA / "vllm-0.33.0-serve.help.txt").read_text())
    assert first.argparse and first.options == () and first.more == "--help=all"
    assert not first.complete and "--help=all" in first.why_not
    full = facts_of("vllm-0.33.0-serve")
    assert full.complete and full.flexible
    registered = {o["option"] for o in accepts("vllm-0.33.0-serve")["options"]}
    listed = set(full.options) - {"-h", "--help"}
    assert listed <= registered
    # what --help=all leaves out: only the hidden `--no-enable-x` / `--no-disable-x`
    assert all(o.startswith(("--no-enable-", "--no-disable-")) for o in registered - listed)


@pytest.mark.parametrize(
    ("file", "why"),
    [
        ("passthrough_wrapper.help.txt", "passes flags it does not list through"),
        ("lab-any-flag.help.txt", "passes flags it does not list through"),
        ("entrypoint_nohelp.help.txt", "printed no options"),
    ],
)
def test_helps_that_do_not_list_every_flag_are_not_trusted(file: str, why: str) -> None:
    facts = read_help((DATA / file).read_text())
    assert not facts.complete
    assert why in facts.why_not


def test_help_after_log_lines_and_remainder_usage() -> None:
    text = (
        "INFO 11-30 12:00:00 [__init__.py:216] Automatically detected platform cuda.\n"
        "usage: serve.py [-h] [--port PORT] ...\n\noptions:\n  -h, --help   show\n"
        "  --port PORT  the port\n"
    )
    facts = read_help(text)
    assert facts.argparse and "--port" in facts.options
    assert facts.passthrough  # argparse.REMAINDER ("...") takes any flag after it
    assert not read_help(text.replace(" ...", "")).passthrough


@pytest.mark.parametrize(
    "prose",
    [
        "Any other flag is passed through to the server unchanged.",
        "Unknown arguments are forwarded to sglang.launch_server.",
        "Arguments not listed here are passed to vllm serve.",
        "Extra args go to the engine.",
        "All remaining options are handed to python -m sglang.launch_server as-is.",
        "Uses parse_known_args; the rest goes to the server.",
    ],
)
def test_pass_through_wording_in_description_or_epilog(prose: str) -> None:
    text = (
        f"usage: run.py [-h] [--tp TP]\n\n{prose}\n\noptions:\n  -h, --help  help\n"
        "  --tp TP     tensor parallel\n"
    )
    assert read_help(text).passthrough


# ---------------------------------------------------------------------------- zero false refusals


@dataclass
class Row:
    help: str
    trusted: bool
    options: int
    forms: int
    refused: int  # refused by the preflight before any start, though the parser takes it
    left_to_server: int  # predicted refusals the dry parse hands back (hidden options)


def _named_by_dry_parse(error: str, flag: str) -> bool:
    """Whether the dry parse's complaint (recorded from the real parser) refuses `flag`."""
    rest = _without_probe(error)
    return rest.startswith(REFUSING) and flag in rest.replace(",", " ").split()


def _row(name: str) -> tuple[Row, list[str]]:
    facts = facts_of(name)
    options, forms = taken_by_the_real_parser(name)
    dry = accepts(name)["dry_parse"]
    predicted = [
        f for f in options + forms if any(p.fatal for p in predict(facts, [f], suggest=False))
    ]
    # A prediction is a refusal only once the server's parser names the flag in the dry
    # parse (recorded from the real parser for every option string; a spelling without a
    # record counts as refused).
    refused = [f for f in predicted if f not in dry or _named_by_dry_parse(dry[f], f)]
    return Row(
        name, facts.complete, len(options), len(forms), len(refused), len(predicted)
    ), refused


def test_the_real_parsers_dry_parse_names_none_of_their_own_options() -> None:
    for name in RECORDED:
        dry = accepts(name)["dry_parse"]
        assert len(dry) >= 480
        assert [o for o, error in dry.items() if _named_by_dry_parse(error, o)] == []
        assert sum(e == f"unrecognized arguments: {PROBE}" for e in dry.values()) > 450


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_zero_false_refusals(name: str) -> None:
    """Every option string the real parser registers, and every other spelling it takes,
    passes the preflight: predictions fall only on options the help cannot show."""
    row, refused = _row(name)
    assert row.trusted
    assert refused == []
    assert row.refused == 0


@pytest.mark.parametrize(
    "file", ["passthrough_wrapper.help.txt", "lab-any-flag.help.txt", "entrypoint_nohelp.help.txt"]
)
def test_untrusted_helps_refuse_nothing(file: str, tmp_path: Path) -> None:
    """Whatever the server behind them takes (here: all of SGLang's and vLLM's option
    strings), a help not trusted predicts nothing: the preflight refuses none of it."""
    script = tmp_path / "server"
    script.write_text(f"#!/bin/sh\ncat {shlex.quote(str(DATA / file))}\n")
    script.chmod(0o755)
    flags = [o["option"] for n in RECORDED for o in accepts(n)["options"]]
    flags = [f.lstrip("-") for f in flags if f.startswith("--")]
    exp = Experiment(name="x", exec=(str(script),), flags=tuple((f, "1") for f in flags))
    pf, said = _preflight()
    assert pf.check(exp) == Check()
    assert [e["kind"] for _, e in said] == ["help-untrusted"]


UNTRUSTED = ["passthrough_wrapper.help.txt", "lab-any-flag.help.txt", "entrypoint_nohelp.help.txt"]


def test_print_the_zero_false_refusal_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The table of the closing note. Helps not trusted predict nothing (see
    test_untrusted_helps_refuse_nothing): the server behind them may take any flag, tried
    here with every option string of both recorded servers."""
    rows = [_row(n)[0] for n in sorted(RECORDED)]
    every = {o["option"] for n in RECORDED for o in accepts(n)["options"]}
    for file in UNTRUSTED:
        facts = read_help((DATA / file).read_text())
        assert not facts.complete
        rows.append(Row(file, False, len(every), 0, 0, 0))
    with capsys.disabled():
        print(
            "\n| help | trusted to predict | option strings the parser takes | other "
            "spellings it takes | refused by the preflight | predictions left to the "
            "server |"
        )
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r.help} | {r.trusted} | {r.options} | {r.forms} | {r.refused} "
                f"| {r.left_to_server} |"
            )
    assert all(r.refused == 0 for r in rows)


# ---------------------------------------------------------------------------- predictions


def test_seed_002_cuda_graph_max_bs_is_ambiguous_in_sglangs_own_words() -> None:
    (problem,) = predict(facts_of("sglang-0.5.23"), ["--cuda-graph-max-bs"])
    assert problem.kind == "ambiguous" and problem.fatal
    assert problem.message == accepts("sglang-0.5.23")["forms"]["--cuda-graph-max-bs"]


@pytest.mark.parametrize(
    "flag",
    [
        "--max_model_len",
        "--max-model-len=4096",
        "--compilation-config.level",
        "--compilation_config.mode",
        "--hf-overrides.rope_scaling",
        "-O3",
        "-O",
        "--config",
        "--no-enable-prefix-caching",
        "--no-disable-log-stats",
        "-tp",
        "--max-model",
    ],
)
def test_vllm_spellings_are_accepted(flag: str) -> None:
    assert [p for p in predict(facts_of("vllm-0.33.0-serve"), [flag]) if p.fatal] == []


def test_normalize() -> None:
    assert normalize("--max_model_len", flexible=True) == "--max-model-len"
    assert normalize("--compilation_config.pass_config.x", flexible=True) == "--compilation-config"
    assert normalize("--limit-mm-per-prompt.image+", flexible=True) == "--limit-mm-per-prompt"
    assert normalize("--reasoning_parser=x", flexible=False) == "--reasoning_parser"


def _argparse_like(name: str) -> argparse.ArgumentParser:
    """A parser with exactly the option strings the real one registers (grouped by dest):
    what argparse's matching (exact, prefix, ambiguity) depends on."""

    class Raising(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise ValueError(message)

    parser = Raising(prog="x", add_help=False)
    by_dest: dict[str, list[dict[str, Any]]] = {}
    for o in accepts(name)["options"]:
        by_dest.setdefault(o["dest"], []).append(o)
    for dest, opts in by_dest.items():
        strings = [o["option"] for o in opts]
        if opts[0]["switch"]:
            parser.add_argument(*strings, dest=dest, action="store_true")
        else:
            parser.add_argument(*strings, dest=dest)
    return parser


def _generated(options: list[str]) -> list[str]:
    names: list[str] = []
    for o in options:
        if not o.startswith("--"):
            continue
        body = o[2:]
        names += [o, o[:-1], o[: 2 + len(body) // 2], o[: 2 + max(len(body) - 4, 1)]]
        if len(body) > 3:
            i = len(body) // 2
            names.append("--" + body[:i] + body[i + 1] + body[i] + body[i + 2 :])  # swap
            names.append("--" + body[:i] + body[i + 1 :])  # drop
    return list(dict.fromkeys(names))


def test_predictions_agree_with_argparse_on_the_same_option_strings() -> None:
    """SGLang 0.5.23 (plain argparse): exact names, prefixes and typos of every option. The
    preflight decides as argparse does except where a hidden option is involved, where
    it can only be wrong toward accepting (safe: the run dies at argument parsing, fast)
    or toward a prediction the dry parse withdraws."""
    name = "sglang-0.5.23"
    parser = _argparse_like(name)
    hidden = [o["option"] for o in accepts(name)["options"] if o["hidden"]]
    facts = facts_of(name)
    names = _generated([o["option"] for o in accepts(name)["options"]])
    agree, differ = 0, []
    for flag in names:
        try:
            _, extras = parser.parse_known_args([flag, "1"])
            truth = "unrecognized" if flag in extras else "ok"  # "1" left over by a switch
        except ValueError as exc:
            truth = "ambiguous" if "ambiguous" in str(exc) else "ok"  # a value error: taken
        fatal = [p for p in predict(facts, [flag], suggest=False) if p.fatal]
        ours = fatal[0].kind if fatal else "ok"
        if ours == truth:
            agree += 1
        else:
            differ.append((flag, truth, ours))
    assert differ, "expected the hidden options to show"  # the data has hidden options
    for flag, _truth, _ours in differ:
        assert any(h.startswith(flag) or flag == h for h in hidden), (flag, _truth, _ours)
    print(
        f"\n{name}: {agree} of {len(names)} generated names decided as argparse does; "
        f"{len(differ)} involve hidden options: {differ}"
    )


# ---------------------------------------------------------------------------- server's words


def test_parser_error_and_the_probe() -> None:
    out = (
        "usage: launch_server.py [-h] [--port PORT]\n                        [--x X]\n"
        "launch_server.py: error: unrecognized arguments: --tp-szie 8 " + PROBE + "\n"
    )
    error = parser_error(out)
    assert error == f"unrecognized arguments: --tp-szie 8 {PROBE}"
    assert _without_probe(error) == "unrecognized arguments: --tp-szie 8"
    assert _without_probe(f"unrecognized arguments: {PROBE}") == ""
    assert (
        parser_error("sglang serve: error: ambiguous option: --a could match --ab, --ac")
        == "ambiguous option: --a could match --ab, --ac"
    )
    assert parser_error("Traceback (most recent call last):\nValueError: x\n") is None


# ---------------------------------------------------------------------------- real programs


def _preflight() -> tuple[Preflight, list[tuple[str, dict[str, object]]]]:
    said: list[tuple[str, dict[str, object]]] = []
    host = Host(
        name="here",
        address="localhost",
        transport="local",  # type: ignore[arg-type]
        env=(("PYTHONPATH", str(REPO)), ("ORCH_LAB_TIME_SCALE", "0.01")),
    )
    t = LocalTransport(host)
    pf = Preflight(
        lambda cmd, timeout, stdin: t.run(
            f"cd {shlex.quote(str(REPO))} && {cmd}", timeout=timeout, stdin=stdin
        ),
        lambda message, extra: said.append((message, extra)),
    )
    return pf, said


def lab(rel: str, **flags: object) -> Experiment:
    return (
        load_experiment(LAB / rel).with_changes(flags=flags)
        if flags
        else load_experiment(LAB / rel)
    )


def test_dry_parse_confirms_seed_002_in_the_servers_words() -> None:
    pf, said = _preflight()
    check = pf.check(lab("b300-v0523/seed_good.yaml"))
    assert check.refusal == (
        "the server rejects the flags: ambiguous option: "
        "--cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill"
    )
    assert said == []  # nothing contradicted, nothing to say
    assert pf.trusted(lab("b300-v0523/seed_good.yaml"))


def test_dry_parse_confirms_an_unknown_flag_with_close_matches() -> None:
    pf, _ = _preflight()
    check = pf.check(lab("b300/good.yaml", **{"tp-szie": 8}))
    assert check.refusal is not None
    assert check.refusal.startswith(
        "the server rejects the flags: unrecognized arguments: --tp-szie 8 (did you mean --tp-size"
    )


def test_hidden_option_withdraws_the_trust_once() -> None:
    """The lab server accepts `--seed` but hides it from --help (argparse SUPPRESS, as
    SGLang's hidden options): predicted unknown, taken by the dry parse, never refused."""
    pf, said = _preflight()
    first = lab("b300/good.yaml", seed=3)
    assert pf.check(first) == Check()
    assert not pf.trusted(first)
    assert pf.check(lab("b300/good.yaml", seed=4, **{"tp-szie": 8})) == Check()  # not trusted
    assert [e["kind"] for _, e in said] == ["help-distrusted"]
    assert "--seed" in said[0][0] and "no longer trusted" in said[0][0]


def test_a_run_settles_a_prediction_the_dry_parse_left_open() -> None:
    pf, said = _preflight()
    exp = lab("b300/good.yaml", seed=3)
    pf.help_of(exp)
    (problem,) = [p for p in predict(pf.help_of(exp).facts, ["--seed"]) if p.fatal]
    open_check = Check(predicted=(problem,), trusted=True)
    # dying at argument parsing confirms it: still trusted, nothing said
    pf.settle(exp, open_check, Verdict.INVALID, Signature(Phase.ARGS, "argparse", "x"), "r1")
    pf.settle(exp, open_check, Verdict.INFRA, None, "r2")  # says nothing about flags
    assert pf.trusted(exp) and said == []
    # starting (or dying elsewhere) contradicts it, said once
    pf.settle(exp, open_check, Verdict.PASS, None, "r3")
    pf.settle(exp, open_check, Verdict.OTHER, Signature(Phase.INIT, "x", "y"), "r4")
    assert not pf.trusted(exp)
    assert [e["kind"] for _, e in said] == ["help-distrusted"] and "run r3" in said[0][0]


def test_pass_through_wrapper_and_no_help_script_refuse_nothing() -> None:
    pf, said = _preflight()
    wrapper = replace(
        lab("b300/good.yaml", **{"tp-szie": 8}),
        exec=(sys.executable, str(DATA / "passthrough_wrapper.py"), "--scenario", "b300"),
    )
    nohelp = replace(wrapper, exec=("sh", str(DATA / "entrypoint_nohelp.sh")))
    assert pf.check(wrapper) == Check()
    assert pf.check(nohelp) == Check()
    kinds = [(e["kind"], e["reason"]) for _, e in said]
    assert kinds == [
        ("help-untrusted", "it says it passes flags it does not list through"),
        ("help-untrusted", "--help exited 64"),
    ]


def test_a_help_not_trusted_is_said_once_for_every_build(tmp_path: Path) -> None:
    """Each build of a server has its own executable, all with the same help: its distrust
    is one note, not one per build."""
    pf, said = _preflight()
    base = replace(
        lab("b300/good.yaml"),
        exec=(sys.executable, str(DATA / "passthrough_wrapper.py"), "--scenario", "b300"),
    )
    for version in ("0.5.22", "0.5.23rc1", "0.5.23"):
        prefix = tmp_path / version / "bin"
        prefix.mkdir(parents=True)
        (prefix / "python3").symlink_to(sys.executable)
        exp = replace(base, exec=(str(prefix / "python3"), *base.exec[1:]), build=version)
        assert pf.check(exp) == Check()
    (note,) = said
    assert note[1]["kind"] == "help-untrusted" and "said once for every build" in note[0]


def test_paged_help_is_followed_to_help_all(tmp_path: Path) -> None:
    """A server printing vLLM's recorded pages: `--help` (groups only) and `--help=all`."""
    script = tmp_path / "vllm"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--help=all*) cat {DATA / "vllm-0.33.0-serve.help-all.txt"};;\n'
        f"  *--help*) cat {DATA / 'vllm-0.33.0-serve.help.txt'};;\n"
        '  *) echo "vllm serve: error: unrecognized arguments: $*" >&2; exit 2;;\nesac\n'
    )
    script.chmod(0o755)
    pf, said = _preflight()
    exp = Experiment(
        name="v",
        exec=(str(script), "serve", "Qwen/Qwen3-0.6B"),
        flags=(
            ("max_model_len", 4096),
            ("compilation-config.level", 3),
            ("no-enable-prefix-caching", True),
            ("tensor-parallel-size", 8),
        ),
    )
    assert pf.check(exp) == Check()
    entry = pf.help_of(exp)
    assert entry.followed == "--help=all" and entry.trusted and said == []


# ---------------------------------------------------------------------------- args failures


@pytest.mark.parametrize(
    ("log", "words"),
    [
        ("sglang_argparse_unrecognized.log", "unrecognized arguments: --reasoning_parser kimi_k2"),
        (
            "argparse_ambiguous.log",
            "ambiguous option: --expect-worker could match "
            "--expect-workers, --expect-workers-max-wait",
        ),
    ],
)
def test_a_run_that_dies_at_argument_parsing_is_invalid_in_the_servers_words(
    log: str, words: str
) -> None:
    from orchestrator.diagnosis.classify.judge import RunEvidence, judge
    from orchestrator.execution.preflight import args_detail

    text = (REPO / "tests" / "data" / "logs" / log).read_text()
    target = Signature(Phase.CUDA_GRAPH, "cublas", "CUBLAS_STATUS_EXECUTION_FAILED")
    for tgt in (None, target):  # the bad endpoint, and any variant of the search
        verdict, sig = judge(RunEvidence(log_tail=text, exit_code=2), tgt)
        assert verdict is Verdict.INVALID and sig is not None and sig.phase is Phase.ARGS
    assert args_detail(text, sig, Check()) == f"the server rejects its command line: {words}"


@pytest.mark.parametrize(
    "text",
    [
        "usage: launch_server.py [-h] [--port PORT]\n",  # usage, then exit 2, no error line
        "launch_server.py: error: argument --tokenizer-mode: invalid choice: 'x' "
        "(choose from 'auto', 'slow')\n",
        "usage: x [-h] [--a A]\nx: error: argument --a: expected one argument\n",
    ],
)
def test_other_argument_errors_are_invalid_too(text: str) -> None:
    from orchestrator.diagnosis.classify.judge import RunEvidence, judge

    verdict, sig = judge(RunEvidence(log_tail=text, exit_code=2), None)
    assert verdict is Verdict.INVALID and sig is not None and sig.phase is Phase.ARGS


def test_a_usage_line_alone_is_not_an_argparse_help() -> None:
    """A shell script's getopt-style usage (often started by an unknown option)."""
    facts = read_help("usage: run.sh [-m model] [-p port] [extra server flags]\n")
    assert not facts.argparse and not facts.complete
