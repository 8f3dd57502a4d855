"""The environment of a run: the fact command run for real on this machine (the lab's
nvidia-smi stand-in on PATH, real distributions read by a real interpreter), the pure
parser on recorded output of real hosts' shapes, and how the store keeps, deduplicates
and compares environments (the cache serves only the host's current environment)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.campaign import envwatch
from orchestrator.config.experiment import Experiment
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution import environment as envfacts
from orchestrator.execution.contract import RunResult
from orchestrator.execution.environment import HostEnvironment
from orchestrator.store.store import Store
from tests.support.run_results import run_result

FACTS = Path(__file__).parent / "data" / "facts"
REPO = Path(__file__).resolve().parents[1]
LAB_BIN = REPO / "orchestrator" / "lab" / "bin"
GOOD = REPO / "experiments" / "lab" / "b300" / "good.yaml"


def run_fact(cmd: str, *, path_first: Path | None = LAB_BIN, extra: dict | None = None) -> str:
    env = {
        "PATH": (f"{path_first}:" if path_first else "") + "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
    } | (extra or {})
    res = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


# ---- the parser on recorded output


def test_parse_an_8_gpu_sglang_host() -> None:
    env = envfacts.parse((FACTS / "env_h100_sglang.txt").read_text())
    assert (env.gpu_model, env.gpu_count, env.gpu_memory) == (
        "NVIDIA H100 80GB HBM3",
        8,
        "81559 MiB",
    )
    assert (env.driver, env.cuda, env.torch_cuda, env.nccl) == (
        "570.133.20",
        "12.8",
        "12.8",
        "2.27.3",
    )
    assert env.kernel == "5.15.0-139-generic" and env.python == "3.12.3"
    assert (env.server, env.server_version) == ("sglang", "0.5.2")
    assert env.packages["sgl-kernel"] == "0.3.9.post2" and env.packages["flashinfer"] == "0.3.1"
    assert env.packages["vllm"] is None and env.packages["deep_ep"] is None  # absent, recorded
    assert env.interpreter == "/opt/sglang/.venv/bin/python3 (shebang)"
    rows = dict(env.rows())
    assert rows["GPU"] == "8 x NVIDIA H100 80GB HBM3 (81559 MiB)"
    assert rows["not installed"] == "vllm, deep_ep"


def test_parse_mixed_gpus_and_vllm() -> None:
    env = envfacts.parse((FACTS / "env_mixed_gpus_vllm.txt").read_text())
    assert env.gpu_count == 3
    assert "2 x NVIDIA RTX PRO 6000 Blackwell Server Edition" in (env.gpu_model or "")
    assert "1 x NVIDIA L40S" in (env.gpu_model or "")
    assert (env.server, env.server_version, env.cuda) == ("vllm", "0.10.1.1", "12.9")


@pytest.mark.parametrize("name", ["env_no_gpu.txt", "env_driver_failed.txt"])
def test_absent_things_are_recorded_as_absent_never_an_error(name: str) -> None:
    env = envfacts.parse((FACTS / name).read_text())
    assert env.gpu_count == 0 and env.gpu_model is None and env.driver is None
    assert env.cuda is None and env.nccl is None and env.kernel
    rows = dict(env.rows())
    assert rows["GPU"] == "absent" and rows["driver"] == "absent"


def test_parse_survives_garbage() -> None:
    for text in ("", "@@PYJSON {not json", "@@PYJSON [1,2]", "@@NVSMI\n,,,\n@@KERNEL\n"):
        env = envfacts.parse(text)
        assert env.gpu_count == 0 and env.python is None


def test_changes_name_what_differs() -> None:
    old = envfacts.parse((FACTS / "env_h100_sglang.txt").read_text())
    new = replace(old, driver="575.57.08", packages=old.packages | {"flashinfer": "0.3.2"})
    assert envfacts.changes(old, new) == [
        "driver 570.133.20 -> 575.57.08",
        "flashinfer 0.3.1 -> 0.3.2",
    ]
    assert old.digest() != new.digest()
    assert HostEnvironment.from_dict(new.to_dict()) == new


# ---- the command, run for real


def test_command_on_this_machine_with_the_lab_stand_in(tmp_path: Path) -> None:
    """The lab's nvidia-smi on PATH; a distribution on the config's PYTHONPATH is read
    with the server's interpreter (a real dist-info, read by importlib.metadata)."""
    site = tmp_path / "site"
    (site / "torch-2.9.1.dist-info").mkdir(parents=True)
    (site / "torch-2.9.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\n"
    )
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_text("cuda: Optional[str] = '13.0'\n")
    exp = load_experiment(GOOD)
    cmd = envfacts.command(
        [sys.executable, "-m", "orchestrator.lab.server"], env=[("PYTHONPATH", f"{site}:{REPO}")]
    )
    env = envfacts.parse(run_fact(cmd))
    assert (env.gpu_count, env.gpu_model, env.driver, env.cuda) == (
        8,
        "NVIDIA B300 SXM6 AC",
        "580.95.05",
        "13.0",
    )
    assert env.packages["torch"] == "2.9.1" and env.torch_cuda == "13.0"
    assert env.server == "orchestrator" and env.server_version  # the lab's own package
    assert env.python == sys.version.split()[0]
    assert env.interpreter == f"{sys.executable} (exec)"
    assert exp.exec[0] == "python3"


def test_lab_stand_in_file_changes_the_driver(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.json"
    gpus.write_text('{"driver": "590.10.01", "count": 2, "name": "NVIDIA B300 (lab)"}')
    cmd = envfacts.command(["python3", "-m", "json.tool"])
    env = envfacts.parse(run_fact(cmd, extra={"ORCH_LAB_GPUS": str(gpus)}))
    assert (env.driver, env.gpu_count, env.gpu_model) == ("590.10.01", 2, "NVIDIA B300 (lab)")
    gpus.write_text('{"count": 0}')
    env = envfacts.parse(run_fact(cmd, extra={"ORCH_LAB_GPUS": str(gpus)}))
    assert env.gpu_count == 0 and env.driver is None


def test_interpreter_from_a_console_scripts_shebang(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    env = envfacts.parse(
        run_fact(envfacts.command(["vllm", "serve", "m"]), path_first=script.parent)
    )
    assert env.interpreter == f"{sys.executable} (shebang)" and env.server == "vllm"
    assert env.gpu_count == 0  # no nvidia-smi on this PATH: absent
    # no interpreter at all: the facts that do not need one are still there
    env = envfacts.parse(run_fact(envfacts.command(["/nonexistent/python3", "-m", "x"])))
    assert env.python is None and env.gpu_count == 8 and env.kernel


def test_secrets_stay_out_of_the_command() -> None:
    exp = Experiment.from_dict(
        {
            "name": "s",
            "service": {
                "exec": "python3 -m sglang.launch_server",
                "flags": {"port": 30000},
                "env": {
                    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123",
                    "NCCL_DEBUG": "WARN",
                    "MY_API_KEY": "k3y-value-long",
                },
            },
        }
    )
    cmd = envfacts.command(exp.exec, env=envfacts.public_env(exp))
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in cmd and "k3y-value-long" not in cmd
    assert "NCCL_DEBUG=WARN" in cmd


# ---- the store


def Result(exp: Experiment, verdict: Verdict, environment: HostEnvironment | None) -> RunResult:  # noqa: N802
    """A run that saw `environment` on its host (None: a cache hit, which keeps its source's)."""
    return run_result(exp, verdict, environment=environment)


def test_store_keeps_environments_and_the_cache_follows_the_host(tmp_path: Path) -> None:
    store = Store(tmp_path / "results")
    exp = load_experiment(GOOD)
    old = envfacts.parse((FACTS / "env_h100_sglang.txt").read_text())
    new = replace(old, driver="575.57.08")
    cid = store.create_campaign(kind="bisect", key="k", command="c", spec={})
    r1 = store.add_run(cid, variant=(), purpose="endpoint", result=Result(exp, Verdict.PASS, old))
    r2 = store.add_run(cid, variant=(0,), purpose="search", result=Result(exp, Verdict.PASS, old))
    assert store.run(r1).env_digest == store.run(r2).env_digest == old.digest()
    assert store.db.execute("SELECT count(*) FROM environments").fetchone()[0] == 1
    # the same command again, after a driver upgrade: the check names the change
    changed = Result(exp, Verdict.FAIL, new)
    result, err = envwatch.check(store, cid, changed)
    assert err is not None and "driver 570.133.20 -> 575.57.08" in str(err)
    assert result.verdict is Verdict.INFRA and "changed during the campaign" in result.detail
    r3 = store.add_run(cid, variant=(1,), purpose="search", result=result)
    seen = store.campaign_environments(cid)
    assert [(s.host, s.digest, s.runs) for s in seen] == [
        ("h1", old.digest(), [r1, r2]),
        ("h1", new.digest(), [r3]),
    ]
    # the cache: the host now has the new environment; the old verdict is not served
    assert store.latest_env_digest("h1") == new.digest()
    assert store.cached(exp.fingerprint(), "b300", env_digest=new.digest()) is None
    hit = store.cached(exp.fingerprint(), "b300", env_digest=old.digest())
    assert hit is not None and hit.id == r2
    # a cache hit keeps its source's environment
    r4 = store.add_run(
        cid, variant=(), purpose="cache", result=Result(exp, Verdict.PASS, None), cached_from=r2
    )
    assert store.run(r4).env_digest == old.digest()
    # unchanged: no error, the result as it was
    same, err = envwatch.check(store, cid, Result(exp, Verdict.PASS, old))
    assert err is None and same.verdict is Verdict.PASS


def test_an_older_database_gains_the_column_on_open(tmp_path: Path) -> None:
    root = tmp_path / "results"
    Store(root).close()
    db = sqlite3.connect(root / "orchestrator.db")
    db.execute("ALTER TABLE runs DROP COLUMN env_digest")
    db.execute("DROP TABLE environments")
    db.commit()
    db.close()
    store = Store(root)
    cols = {r["name"] for r in store.db.execute("PRAGMA table_info(runs)")}
    assert "env_digest" in cols
    assert store.environment("nope") is None and store.campaign_environments("x") == []
