"""The real vLLM of the `real` tier: the cached venv and models of scripts/build-vllm.

The tier needs the venv built (`scripts/build-vllm`, which `ORCH_WITH_VLLM=1
scripts/bootstrap` and the full `scripts/test` run). Outside CI a machine without it skips
the tier with one line saying why; under CI (`CI=true`) that is a failure, never a skip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.lab import vllm_env

REAL = Path(__file__).resolve().parents[2] / "experiments" / "real" / "vllm-cpu"


@dataclass(frozen=True)
class RealVllm:
    """Where the built vLLM and model are, and the shipped incidents (moved to a test's
    ports by tests/hosts/vllm_incidents.py)."""

    vllm: Path
    model: Path
    experiments: Path = REAL
    #: real weights: SmolLM2-135M-Instruct, bf16 (orchestrator/lab/smollm2.py)
    smollm2: Path = vllm_env.lab_dir() / "smollm2"


@pytest.fixture(scope="session")
def vllm_real() -> RealVllm:
    """The built vLLM venv and tiny model, or a skip (outside CI) / failure (CI) saying why."""
    if not vllm_env.ready():
        why = (
            f"the real vLLM venv is not built ({vllm_env.venv_path()} missing or "
            "incomplete): run scripts/build-vllm, or ORCH_WITH_VLLM=1 scripts/bootstrap"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    lab = vllm_env.lab_dir()
    return RealVllm(vllm=lab / "bin" / "vllm", model=lab / "model")
