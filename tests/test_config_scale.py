"""Configs with thousands of flags: loading, diffing, planning and the flag check grow
linearly with the number of flags. Proven by counting work, never by timing: the calls
the interpreter makes (Python functions, generator steps and C functions alike) for n
flags and for 4n flags; linear work grows about 4x, quadratic work 16x."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.campaign.planning import make_plan
from orchestrator.config.loading import load_experiment
from orchestrator.execution.preflight import check_flags
from orchestrator.planner import strategies

#: what 4x the flags may cost at most: 4x and some slack for fixed costs; quadratic is 16x
LINEAR = 5.0
N = 400


def calls(fn: Callable[[], object]) -> int:
    """How many calls running `fn` makes (every Python frame entered or resumed, and every
    call into C), counted by the interpreter's profiling hook."""
    count = 0

    def hook(frame: object, event: str, arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def configs(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """A good config with n flags (and a secret) and a bad one extending it that changes
    every flag, adds n more and one env var."""
    d = tmp_path / str(n)
    d.mkdir()
    good = [
        "name: good",
        "service:",
        "  exec: /opt/sglang/bin/python -m sglang.launch_server",
        "  env: {NCCL_DEBUG: WARN, HF_TOKEN: hf_abcdefghijklmnopqrstuvwxyz}",
        "  flags:",
        "    port: 30000",
    ]
    good += [f"    flag-{i}: {i}" for i in range(n)]
    bad = ["extends: good.yaml", "service:", "  env: {NCCL_ALGO: Tree}", "  flags:"]
    bad += [f"    flag-{i}: {i + 1}" for i in range(n)]
    bad += [f"    --new-flag-{i}: v{i}" for i in range(n)]
    (d / "good.yaml").write_text("\n".join(good) + "\n")
    (d / "bad.yaml").write_text("\n".join(bad) + "\n")
    return d / "good.yaml", d / "bad.yaml"


def growth(tmp_path: Path, work: Callable[[Path, Path], object]) -> float:
    small = calls(lambda: work(*configs(tmp_path / "s", N)))
    large = calls(lambda: work(*configs(tmp_path / "l", 4 * N)))
    return large / small


def test_loading_a_config_is_linear_in_its_flags(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "l").mkdir()
    ratio = growth(tmp_path, lambda good, bad: load_experiment(bad))
    assert ratio < LINEAR, f"4x the flags cost {ratio:.1f}x the work"
    exp = load_experiment(configs(tmp_path / "s", 3)[1])
    assert [k for k, _ in exp.flags][-2:] == ["new-flag-1", "new-flag-2"]


def test_diff_and_variants_are_linear_in_the_flags(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "l").mkdir()

    def plan_and_build(good: Path, bad: Path) -> None:
        plan = make_plan(good, bad)
        half = frozenset(range(0, plan.n, 2))
        variant = plan.variant(half)  # good + every other delta
        assert variant.flag_map()["flag-0"] == 1 and "flag-1" in variant.flag_map()
        plan.describe(half)

    ratio = growth(tmp_path, plan_and_build)
    assert ratio < LINEAR, f"4x the flags cost {ratio:.1f}x the work"


def test_the_flag_check_is_linear_in_the_flags() -> None:
    accepted = [f"--option-{i}" for i in range(300)] + ["--tp-size", "--tp"]

    def check(n: int) -> None:
        requested = [f"--flag-{i}" for i in range(n)] + ["--tp-s", "--option-"]
        problems = check_flags(requested, accepted)
        assert len(problems) == n + 2  # every unknown flag, the abbreviation, the ambiguity
        assert problems[-2].kind == "abbreviation"
        assert problems[-1].kind == "ambiguous"
        assert problems[-1].candidates[:3] == ("--option-0", "--option-1", "--option-2")

    ratio = calls(lambda: check(4 * N)) / calls(lambda: check(N))
    assert ratio < LINEAR, f"4x the flags cost {ratio:.1f}x the work"


def test_run_estimates_simulate_a_bounded_amount_of_work(monkeypatch) -> None:  # noqa: ANN001
    """The estimate `plan` and `bisect` show simulates the search for evenly spread culprit
    placements; for many deltas it tries fewer of them, so its work stays bounded."""
    simulated: list[int] = []

    def counting(strategy, n, oracle):  # noqa: ANN001, ANN202
        simulated.append(n)
        return None, 1

    monkeypatch.setattr(strategies, "simulate", counting)
    for n in (2, 30, 1_000, 20_000, 200_000):
        simulated.clear()
        est = strategies.estimate_runs.__wrapped__(strategies.auto, n)
        assert est["single_mean"] == 1
        work = sum(simulated)
        floor = 2 * strategies.ESTIMATE_MIN_SAMPLES * n
        assert work <= max(2 * strategies.ESTIMATE_BUDGET, floor), (n, work)
    simulated.clear()
    strategies.estimate_runs.__wrapped__(strategies.auto, 8)
    assert len(simulated) == 8 + 28  # small n: every single and every pair placement


def test_libyaml_reads_what_the_python_parser_reads(tmp_path: Path) -> None:
    """Where PyYAML has libyaml, configs are parsed by it (the pure-Python parser needs
    about a minute for a file at the size cap); both read every shipped file the same, and
    both refuse a key given twice."""
    import yaml

    from orchestrator.config import yamlio

    if yaml.__with_libyaml__:
        assert yamlio.FastStrictLoader is not yamlio.StrictLoader
    repo = Path(__file__).resolve().parents[1]
    files = [*repo.glob("experiments/**/*.yaml"), repo / "hosts.example.yaml"]
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        assert yaml.load(text, Loader=yamlio.FastStrictLoader) == yaml.load(
            text, Loader=yamlio.StrictLoader
        ), path
    for loader in (yamlio.FastStrictLoader, yamlio.StrictLoader):
        try:
            yaml.load("a: 1\nb: 2\na: 3\n", Loader=loader)
        except yamlio.DuplicateKey as exc:
            assert (exc.key, exc.line) == ("a", 3)
        else:
            raise AssertionError(f"{loader.__name__} took a key given twice")
