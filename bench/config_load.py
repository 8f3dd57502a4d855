"""Loading and planning configs with many flags: CPU seconds per size.

For 5,000 / 10,000 / 20,000 flags: `load_experiment` of a config that extends another
with as many flags, and `make_plan` + the run estimates + one variant (what `plan` and
`bisect` do before the first run). Then a file just under the 16 MiB size cap, which
is loaded or refused (its launch would be too long for any host).

    .venv/bin/python bench/config_load.py [--sizes 5000,10000,20000] [--no-cap]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from orchestrator.campaign.planning import make_plan
from orchestrator.config.loading import load_experiment
from orchestrator.config.yamlio import MAX_BYTES
from orchestrator.errors import ConfigError

HEAD = (
    "service:\n  exec: /opt/sglang/bin/python -m sglang.launch_server\n"
    "  env: {NCCL_DEBUG: WARN}\n  flags:\n    port: 30000\n"
)


def write_pair(d: Path, n: int) -> tuple[Path, Path]:
    good, bad = d / f"good{n}.yaml", d / f"bad{n}.yaml"
    good.write_text("name: good\n" + HEAD + "".join(f"    flag-{i}: {i}\n" for i in range(n)))
    bad.write_text(
        f"name: bad\nextends: {good.name}\nservice:\n  flags:\n"
        + "".join(f"    flag-{i}: {i + 1}\n" for i in range(n))
    )
    return good, bad


def write_capped(d: Path) -> Path:
    """A config of many flags, as close under MAX_BYTES as lines allow."""
    path = d / "cap.yaml"
    parts, size, i = ["name: cap\n" + HEAD], len(HEAD) + 10, 0
    while True:
        line = f"    flag-number-{i}: value-{i}\n"
        if size + len(line) > MAX_BYTES:
            break
        parts.append(line)
        size, i = size + len(line), i + 1
    path.write_text("".join(parts))
    return path


def cpu(fn) -> tuple[float, object]:  # noqa: ANN001
    t = time.process_time()
    try:
        out = fn()
    except ConfigError as exc:
        out = exc
    return time.process_time() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5000,10000,20000")
    ap.add_argument("--no-cap", action="store_true", help="skip the 16 MiB file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        print(f"{'flags':>8}  {'load (s)':>9}  {'plan (s)':>9}")
        for n in (int(s) for s in args.sizes.split(",")):
            good, bad = write_pair(d, n)
            load_s, _ = cpu(lambda: load_experiment(bad))  # noqa: B023

            def plan(good: Path = good, bad: Path = bad) -> None:
                p = make_plan(good, bad)
                p.estimates()
                p.variant(frozenset(range(0, p.n, 2)))

            plan_s, _ = cpu(plan)
            print(f"{n:>8}  {load_s:>9.2f}  {plan_s:>9.2f}")
        if not args.no_cap:
            path = write_capped(d)
            secs, out = cpu(lambda: load_experiment(path))
            what = f"refused: {out}" if isinstance(out, ConfigError) else "loaded"
            print(f"{path.stat().st_size} bytes (cap {MAX_BYTES}): {secs:.2f} s, {what[:160]}")


if __name__ == "__main__":
    main()
