"""Experiment and hosts configs: loading, extends, round trips, and every bad input's message."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_experiment, load_inventory, parse_duration
from orchestrator.errors import ConfigError, UsageError

REPO = Path(__file__).resolve().parents[1]

BASE = """\
name: base
service:
  unit: sglang.service
  exec: /opt/sglang/bin/python -m sglang.launch_server
  flags:
    model-path: /models/m
    tp-size: 8
    mem-fraction-static: 0.92
    max-running-requests: 256
    enable-foo: true
    port: 30000
  env: {NCCL_DEBUG: WARN}
health: {path: /health, timeout: 15m, ready_after: 2}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_flags_keep_their_types_and_render_exactly(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, "b.yaml", BASE))
    assert exp.flag_map()["max-running-requests"] == 256
    assert exp.flag_map()["mem-fraction-static"] == 0.92
    assert exp.argv() == [
        "/opt/sglang/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--tp-size",
        "8",
        "--mem-fraction-static",
        "0.92",
        "--max-running-requests",
        "256",
        "--enable-foo",
        "--port",
        "30000",
    ]
    assert exp.port == 30000
    assert exp.health.timeout == 900.0
    assert exp.env_map() == {"NCCL_DEBUG": "WARN"}


def test_extends_merges_and_removes(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", BASE)
    child = write(
        tmp_path,
        "child.yaml",
        "extends: base.yaml\nservice:\n  flags: {ep-size: 8, enable-foo: false, tp-size: null}\n"
        "  env: {NCCL_DEBUG: null, NCCL_ALGO: Tree}\n",
    )
    exp = load_experiment(child)
    assert exp.name == "child"
    flags = exp.flag_map()
    assert "enable-foo" not in flags and "tp-size" not in flags
    assert flags["ep-size"] == 8 and flags["model-path"] == "/models/m"
    assert exp.env_map() == {"NCCL_ALGO": "Tree"}
    assert exp.health.timeout == 900.0


def test_extends_cycle_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="'extends' makes a cycle") as err:
        load_experiment(tmp_path / "a.yaml")
    assert err.value.key == "extends"


def test_missing_extends_target(tmp_path: Path) -> None:
    p = write(tmp_path, "a.yaml", "extends: nowhere.yaml\nservice: {exec: x, flags: {port: 1}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment(p)
    assert str(p) in str(err.value) and "nowhere.yaml" in str(err.value)
    assert "extends" in str(err.value)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("", None, "the file is empty"),
        ("- a\n- b\n", None, "expected a mapping"),
        ("service: [\n", None, "not valid YAML at line"),
        ("name: x\nservise: {}\n", "servise", "did you mean 'service'"),
        (BASE + "helth: {}\n", "helth", "did you mean 'health'"),
        (BASE.replace("  env:", "  envv:"), "service.envv", "did you mean 'env'"),
        (BASE.replace("ready_after: 2", "ready_after: many"), "health.ready_after", "integer"),
        (BASE.replace("timeout: 15m", "timeout: soon"), "health.timeout", "duration like"),
        (BASE.replace("path: /health", "path: health"), "health.path", "starting with '/'"),
        (
            BASE.replace("tp-size: 8", "tp-size: {a: 1}"),
            "service.flags.tp-size",
            "a flag value is a scalar",
        ),
        ("service: {flags: {port: 1}}\n", "service.exec", "required key is missing"),
        (BASE.replace("    port: 30000\n", ""), "service.flags.port", "no port"),
        (BASE.replace("port: 30000", "port: http"), "service.flags.port", "port number"),
        (BASE + "probe: {run: x, metric: '(', pass_if: '>= 1'}\n", "probe.metric", "regular"),
        (BASE + "probe: {run: x, metric: '(\\d+)', pass_if: 'fast'}\n", "probe.pass_if", ">="),
        (BASE + "probe: {run: x, repeats: 0}\n", "probe.repeats", "between 1 and 50"),
        (BASE + "probe: {run: x, warmup: -1}\n", "probe.warmup", "between 0 and 10"),
        (BASE + "probe: {run: x, repeats: many}\n", "probe.repeats", "integer"),
        (BASE.replace("sglang.service", "../../etc/passwd"), "service.unit", "unit name"),
        (BASE.replace("NCCL_DEBUG", "1BAD"), "service.env", "not valid"),
    ],
)
def test_bad_experiment_input_gets_a_clear_message(
    tmp_path: Path, text: str, key: str | None, words: str
) -> None:
    p = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_experiment(p)
    message = str(err.value) + " " + (err.value.hint or "")
    assert str(p) in message
    if key:
        assert key in message
    assert words in message


def test_error_names_the_file_the_bad_key_is_in(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", BASE.replace("health:", "healthz:"))
    child = write(tmp_path, "child.yaml", "extends: base.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_experiment(child)
    assert err.value.file == str(tmp_path / "base.yaml")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_experiment(tmp_path)


def test_duration_parsing() -> None:
    assert parse_duration("15m") == 900
    assert parse_duration("1h30m") == 5400
    assert parse_duration("500ms") == 0.5
    assert parse_duration(42) == 42
    for bad in ("", "m", "-5s", True, "5 parsecs"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_duration("720h") == 30 * 86400  # the longest any setting takes
    for absurd in ("99999999999h", "721h", 10**12, "1e400s"):
        with pytest.raises(ValueError, match="at most 30 days|expected a duration"):
            parse_duration(absurd)


def test_roundtrip_through_dict(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, "b.yaml", BASE))
    again = type(exp).from_dict(exp.to_dict())
    assert again == exp
    assert again.fingerprint() == exp.fingerprint()


def test_fingerprint_ignores_flag_order_but_not_values(tmp_path: Path) -> None:
    a = load_experiment(write(tmp_path, "a.yaml", BASE))
    b = a.with_changes(flags={"tp-size": None}).with_changes(flags={"tp-size": 8})
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != a.with_changes(flags={"tp-size": 4}).fingerprint()


def test_shipped_examples_load() -> None:
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        load_experiment(path)
    glm = load_experiment(REPO / "experiments/glm5_tp8.yaml")
    assert glm.port == 8000


# ---------------------------------------------------------------------------- hosts

HOSTS = """\
hosts:
  b300-01: {address: 10.0.0.1, user: ubuntu, known_hosts: kh, identity_file: id, sudo: true,
            labels: [b300]}
  b300-02: {address: 10.0.0.2, known_hosts: kh, labels: [b300]}
  box: {address: 127.0.0.1, known_hosts: ~/.ssh/known_hosts, service_manager: process,
        run_dir: /tmp/x}
pools:
  b300: [b300-01, b300-02]
  by-label: {labels: [b300]}
"""


def test_inventory_loads_and_resolves(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts.yaml", HOSTS))
    assert [h.name for h in inv.resolve("b300")] == ["b300-01", "b300-02"]
    assert [h.name for h in inv.resolve("by-label")] == ["b300-01", "b300-02"]
    h = inv.host("b300-01")
    assert h.known_hosts == str(tmp_path / "kh") and h.sudo and h.host_class == "b300"
    assert inv.host("box").known_hosts.endswith("/.ssh/known_hosts")
    assert not inv.host("box").known_hosts.startswith("~")
    with pytest.raises(UsageError, match="did you mean 'b300-01'"):
        inv.resolve("b300-1")


def test_example_hosts_file_loads() -> None:
    inv = load_inventory(REPO / "hosts.example.yaml")
    assert {"lab", "b300-01", "rtx6000-01"} <= set(inv.hosts)
    assert inv.host("lab").service_manager == "process"
    assert "b300" in inv.pools


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("hosts:\n  a: {adress: x, known_hosts: k}\n", "hosts.a.adress", "did you mean 'address'"),
        ("hosts:\n  a: {address: x}\n", "hosts.a.known_hosts", "host keys are always verified"),
        ("hosts:\n  a: {address: x, known_hosts: k, port: 99999}\n", "hosts.a.port", "65535"),
        (
            "hosts:\n  a: {address: x, known_hosts: k, service_manager: docker}\n",
            "hosts.a.service_manager",
            "'systemd', 'process' or 'slurm'",
        ),
        (
            "hosts:\n  a: {address: x, known_hosts: k, unit_dir: etc}\n",
            "hosts.a.unit_dir",
            "absolute",
        ),
        (
            "hosts:\n  a: {address: x, known_hosts: k}\npools: {p: [b]}\n",
            "pools.p",
            "unknown host 'b'",
        ),
        ("hosts: {}\npools: {p: []}\n", "pools.p", "no hosts"),
        ("hostz: {}\n", "hostz", "did you mean 'hosts'"),
        ("hosts:\n  a: {address: x, known_hosts: k, sudo: maybe}\n", "hosts.a.sudo", "boolean"),
    ],
)
def test_bad_hosts_input_gets_a_clear_message(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    p = write(tmp_path, "hosts.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_inventory(p)
    message = str(err.value) + " " + (err.value.hint or "")
    assert str(p) in message and key in message and words in message


@pytest.mark.parametrize(
    ("text", "at_90"),
    [(">= 0.95 * reference", False), (">=0.95*reference", False), ("< reference", True)],
)
def test_reference_is_a_synonym_of_good_in_pass_if(tmp_path: Path, text: str, at_90: bool) -> None:
    """A sweep names its good config `reference:`; a bar may say so too."""
    from orchestrator.config.schema import parse_condition

    exp = load_experiment(
        write(
            tmp_path,
            "p.yaml",
            BASE + f"probe:\n  run: bench\n  metric: 'tok/s: ([\\d.]+)'\n  pass_if: '{text}'\n",
        )
    )
    cond = exp.probe.condition
    assert cond is not None and cond.relative_to_good
    assert cond == parse_condition(text.replace("reference", "good"))
    assert exp.probe.read("tok/s: 90", good_metric=100.0) == (90.0, at_90)  # bar: good's 100
    with pytest.raises(ConfigError, match="reference"):
        load_experiment(
            write(
                tmp_path,
                "q.yaml",
                BASE + "probe:\n  run: bench\n"
                "  metric: 'x ([0-9]+)'\n  pass_if: '>= 0.95 * referenc'\n",
            )
        )


def test_probe_repeats_warmup_and_bar(tmp_path: Path) -> None:
    """A probe runs warm-up + repeats times (1 + 3 unless set); a bar relative to good is
    the smallest effect that matters and says which way is better; the defaults leave the
    cache key of a config as it was."""
    probe = "probe: {run: x, metric: '(\\d+)', pass_if: '>= 0.95 * good'}\n"
    exp = load_experiment(write(tmp_path, "a.yaml", BASE + probe))
    assert exp.probe is not None
    assert (exp.probe.warmup, exp.probe.repeats, exp.probe.runs) == (1, 3, 4)
    assert exp.probe.bar == pytest.approx(0.05) and exp.probe.higher_is_better
    assert exp.probe.value([10.0, 90.0, 70.0, 95.0]) == 90.0
    assert "repeats" not in exp.to_dict()["probe"]
    tuned = probe.replace("pass_if", "repeats: 5, warmup: 2, pass_if")
    other = load_experiment(write(tmp_path, "b.yaml", BASE + tuned))
    assert other.probe is not None and other.probe.runs == 7
    assert other.to_dict()["probe"]["repeats"] == 5
    assert other.fingerprint() != exp.fingerprint()
    latency = probe.replace(">= 0.95 * good", "<= 1.1 * good")
    lat = load_experiment(write(tmp_path, "c.yaml", BASE + latency))
    assert lat.probe is not None and not lat.probe.higher_is_better
    assert lat.probe.bar == pytest.approx(0.10)
    absolute = load_experiment(write(tmp_path, "d.yaml", BASE + probe.replace(" * good", "")))
    assert absolute.probe is not None and absolute.probe.bar is None
