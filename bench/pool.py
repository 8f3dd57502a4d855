"""Wall time of a sweep on one host vs a pool of two, on the lab's simulated hosts.

Two systemd containers (the test suite's `systemd_host`: a Debian rootfs booted with
systemd-nspawn, each in its own network namespace, the repo bound read-only, the lab's
rtx6000 server installed as a real unit) run the same 8-config sweep over the shipped
`experiments/lab/rtx6000/perf_good.yaml` (cuda-graph-max-bs x mem-fraction-static),
first on one host, then on the pool of both, each into a fresh results dir. The pool
should take about half the wall time of one host.

    sudo .venv/bin/python bench/pool.py [--time-scale 0.1] [--repeat 1]

Needs root, systemd-nspawn and the cached rootfs (scripts/build-rootfs), like the tests.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.campaign.sweep import SweepCampaign  # noqa: E402
from orchestrator.config.hosts import load_inventory  # noqa: E402
from orchestrator.config.sweep import load_sweep  # noqa: E402
from orchestrator.lab.sdhosts import SystemdHostFactory  # noqa: E402
from orchestrator.lab.units import lab_unit  # noqa: E402
from orchestrator.store.store import RunRow, Store  # noqa: E402

UNIT = "lab-rtx6000.service"
MATRIX = {"cuda-graph-max-bs": [128, 256, 384, 512], "mem-fraction-static": [0.85, 0.92]}


def sweep(
    where: str, hosts_file: Path, sweep_file: Path, results: Path, command: str = "bench/pool.py"
) -> tuple[float, list[RunRow]]:
    """One fresh sweep on host or pool `where`: (wall seconds, its runs). Every run must
    have a verdict on the config (pass or fail): host trouble would not measure the host."""
    store = Store(results)
    try:
        hosts = load_inventory(hosts_file).resolve(where)
        t0 = time.monotonic()
        outcome = SweepCampaign(
            store, load_sweep(sweep_file), hosts, command=f"{command} {where}"
        ).run()
        wall = time.monotonic() - t0
        if outcome.status != "done":
            raise SystemExit(f"sweep on {where} did not finish: {outcome.message}")
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    bad = [
        (r.id, r.verdict.value, r.detail) for r in runs if r.verdict.value not in ("pass", "fail")
    ]
    if bad:
        raise SystemExit(f"sweep on {where}: runs without a verdict on the config: {bad}")
    return wall, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", default="0.1", help="ORCH_LAB_TIME_SCALE of the servers")
    ap.add_argument("--repeat", type=int, default=1, help="sweep repeats (8 configs each)")
    args = ap.parse_args(argv)
    factory = SystemdHostFactory()
    try:
        boxes = [factory.boot(), factory.boot()]
        for box in boxes:
            box.install_unit(UNIT, lab_unit(time_scale=args.time_scale))
        with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp_name:
            tmp = Path(tmp_name)
            hosts = {
                f"gpu{i + 1}": box.hosts_entry(env={"PYTHONPATH": "/opt/orchestrator"})
                for i, box in enumerate(boxes)
            }
            hosts_file = tmp / "hosts.yaml"
            hosts_file.write_text(yaml.safe_dump({"hosts": hosts, "pools": {"duo": list(hosts)}}))
            sweep_file = tmp / "sweep.yaml"
            sweep_file.write_text(
                yaml.safe_dump(
                    {
                        "name": "bench-pool",
                        "matrix": MATRIX,
                        "repeat": args.repeat,
                        "base": str(REPO / "experiments/lab/rtx6000/perf_good.yaml"),
                    }
                )
            )
            n = len(load_sweep(sweep_file).items) * args.repeat
            one, one_runs = sweep("gpu1", hosts_file, sweep_file, tmp / "results-one")
            two, two_runs = sweep("duo", hosts_file, sweep_file, tmp / "results-two")
        print(f"sweep of {n} runs (rtx6000 perf config, lab time scale {args.time_scale})")
        print("| hosts | wall time | runs per host | run time summed |")
        print("|---|---|---|---|")
        for label, wall, runs in (("1 (gpu1)", one, one_runs), ("2 (gpu1, gpu2)", two, two_runs)):
            per_host = ", ".join(f"{h}: {c}" for h, c in Counter(r.host for r in runs).items())
            busy = sum(r.duration for r in runs)
            print(f"| {label} | {wall:.1f} s | {per_host} | {busy:.1f} s |")
        print(f"ratio two hosts / one host: {two / one:.2f}")
    finally:
        factory.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
