"""A slowdown under benchmark noise, bisected through the real CLI over the real sshd.

The lab's `slowdown` pair (`experiments/lab/slowdown/`): six flags changed, one of them
(`--enable-mixed-chunk`) costing about 10 % of the output throughput, the benchmark varying
by about 3 % (CV) between runs of one start and between starts (`seed: random`: each start
draws its own level; the test replays one fixed sequence of those draws, `random:N` in a lab
directory of its own, so it never passes or fails by chance). The probe's bar is relative
to good, so `orchestrator bisect --json` measures: it must name that flag with an interval
around its cost, name no benign flag, and keep every benchmark run of every start with the
run.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import cli, cli_json, lab_pair, lab_servers, sshd_hosts_file

SLOW = "--enable-mixed-chunk"
#: the sequence of the lab's draws the test replays
SEQUENCE = 3


def test_slowdown_named_with_its_effect_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    pair = lab_pair(tmp_path, "slowdown")
    # every start draws afresh, from one sequence fixed for this test: the k-th start's
    # level and runs are the same on every machine and every try
    for side in (pair.good, pair.bad):
        spec = yaml.safe_load(side.read_text())
        spec["service"]["env"] = {
            "ORCH_LAB_SEED": f"random:{SEQUENCE}",
            "ORCH_LAB_DIR": str(tmp_path / "lab-starts"),
        }
        side.write_text(yaml.safe_dump(spec, sort_keys=False))
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    code, out = cli_json(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
        timeout=900,
    )
    assert code == 0, out
    assert out["status"] == "found", out["message"]
    effects = out["effects"]
    [named] = effects["named"]
    assert named["flags"] == [SLOW], effects
    # about -10 %: the interval holds it and lies clear of zero
    assert named["low"] <= -7.0 and named["high"] >= -13.0 and named["high"] < 0, named
    assert [c["flags"] for c in out["culprits"]] == [[SLOW]]
    cleared = {f for e in effects["cleared"] for f in e["flags"]}
    assert SLOW not in cleared
    assert effects["total"]["high"] < 0 and effects["noise_within"] > 0
    assert effects["starts"] >= 5 and effects["runs"] == 4 * effects["starts"]
    assert lab_servers(pair.port) == []
    store = Store(results)
    try:
        runs = store.runs(out["campaign"])
        assert len(runs) == effects["starts"]
        rec = store.host_record(runs[-1].id)
    finally:
        store.close()
    assert rec is not None and len(rec["probe"]["values"]) == 4
    # `show RUN` lists each run of the start
    shown = cli("show", runs[-1].id, "--results", results, timeout=60)
    assert "each run of this start:" in shown.stdout and "(warm-up)" in shown.stdout
