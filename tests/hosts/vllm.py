"""The real vLLM of the `real` tier: the cached venv and tiny model of scripts/build-vllm.

The tier needs the venv built (`scripts/build-vllm`, which `ORCH_WITH_VLLM=1
scripts/bootstrap` and the full `scripts/test` run). Outside CI a machine without it skips
the tier with one line saying why; under CI (`CI=true`) that is a failure, never a skip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from orchestrator.lab import vllm_env
from orchestrator.lab.sshd import free_port

REAL = Path(__file__).resolve().parents[2] / "experiments" / "real" / "vllm-cpu"


@dataclass(frozen=True)
class RealVllm:
    """Where the built vLLM and model are, and the shipped incidents."""

    vllm: Path
    model: Path
    experiments: Path = REAL

    def pair(self, tmp: Path, good: str, bad: str, port: int | None = None,
             ) -> tuple[Path, Path]:  # fmt: skip
        """The shipped pair moved to a port of the test's own (both sides; a free one by
        default). Pairs that share a port share their runs' fingerprints: a results store
        reuses the verdicts of the configs they have in common."""
        port = port or free_port()
        out = []
        for side, name in (("good", good), ("bad", bad)):
            path = tmp / f"{Path(bad).stem}-{side}.yaml"
            path.write_text(yaml.safe_dump({
                "name": f"test-{Path(name).stem}" if side == "bad" else "test-good",
                "extends": str(REAL / name),
                "service": {"flags": {"port": port}}}, sort_keys=False))  # fmt: skip
            out.append(path)
        return out[0], out[1]


@pytest.fixture(scope="session")
def vllm_real() -> RealVllm:
    """The built vLLM venv and tiny model, or a skip (outside CI) / failure (CI) saying why."""
    if not vllm_env.ready():
        why = (f"the real vLLM venv is not built ({vllm_env.venv_path()} missing or "
               "incomplete): run scripts/build-vllm, or ORCH_WITH_VLLM=1 scripts/bootstrap")
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    lab = vllm_env.lab_dir()
    return RealVllm(vllm=lab / "bin" / "vllm", model=lab / "model")
