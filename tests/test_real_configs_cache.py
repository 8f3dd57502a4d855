"""The shipped real vLLM configs follow `ORCH_VLLM_CACHE`: the cached venv and models
moved by it (orchestrator/lab/vllm_env.py) are where every config's command, model and
probe look, and where it is unset they look in the default cache. Fast tier: the configs
as the loader reads them, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.loading import load_experiment
from orchestrator.config.settings_refs import expand
from orchestrator.errors import ConfigError
from orchestrator.lab import vllm_env

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "experiments" / "real").glob("*/*.yaml"))
DEFAULT = "/var/cache/orchestrator-vllm"


def _words(path: Path) -> list[str]:
    exp = load_experiment(path)
    words = list(exp.argv())
    if exp.probe is not None and exp.probe.run:
        words += exp.probe.run.split()
    return words


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_real_config_follows_the_vllm_cache(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_VLLM_CACHE", str(tmp_path / "cache"))
    moved = _words(path)
    assert not [w for w in moved if DEFAULT in w], moved
    lab = str(vllm_env.lab_dir())
    assert moved[0] == f"{lab}/bin/vllm" and any(w.startswith(f"{lab}/") for w in moved[1:])

    monkeypatch.delenv("ORCH_VLLM_CACHE")
    assert _words(path)[0] == f"{vllm_env.lab_dir()}/bin/vllm" == f"{DEFAULT}/lab/bin/vllm"


def test_only_the_orchestrators_settings_with_a_default_are_expanded() -> None:
    env = {"ORCH_X": "/x", "ORCH_EMPTY": "", "HOME": "/home/u"}
    data = {
        "exec": ["${ORCH_X:-/d}/bin/s", "${ORCH_UNSET:-/d}/m", "${ORCH_EMPTY:-/d}/e"],
        "flags": {"api-key": "${API_KEY}", "c": "bash -c 'echo ${HOME:-/h} ${ORCH_X}'"},
        "n": 3,
    }
    assert expand(data, env) == {
        "exec": ["/x/bin/s", "/d/m", "/d/e"],
        "flags": {"api-key": "${API_KEY}", "c": "bash -c 'echo ${HOME:-/h} ${ORCH_X}'"},
        "n": 3,
    }


@pytest.mark.parametrize(
    "value", ["/tmp/my cache", "/tmp/it's", '/tmp/a"b', "/tmp/a\\b", "/x$HOME", "/x`id`"]
)
def test_a_setting_that_is_not_one_word_is_refused_at_load(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with a space the shipped command read `/tmp/my` `cache/lab/bin/vllm`: another command
    monkeypatch.setenv("ORCH_VLLM_CACHE", value)
    with pytest.raises(ConfigError, match=r"ORCH_VLLM_CACHE=.* is not one plain word"):
        load_experiment(REPO / "experiments" / "real" / "vllm-cpu" / "good.yaml")
    # a value only a shell would miss (a setting no config names) is never read
    assert expand({"exec": "${ORCH_OTHER:-/d}/x"}, {"ORCH_VLLM_CACHE": value}) == {"exec": "/d/x"}
