"""A controller to be killed: runs one variant with the Executor, for the SIGKILL tests.

    python tests/support/executor_child.py SPEC.json

SPEC: {"hosts": PATH, "host": NAME, "service": UNIT, "campaign": ID, "experiment": {...}}
(`Experiment.to_dict()`). It prints `POLLING` (flushed) at the first poll of the run, so
the test knows the server runs under our drop-in or launch script, then keeps going until
the test kills it with SIGKILL: nothing of `close()` or `finally` runs, exactly like a
controller that crashed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.config.experiment import Experiment  # noqa: E402
from orchestrator.config.hosts import load_inventory  # noqa: E402
from orchestrator.events import Event, Polled  # noqa: E402
from orchestrator.execution.executor import Executor  # noqa: E402


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    host = load_inventory(spec["hosts"]).host(spec["host"])
    exp = Experiment.from_dict(spec["experiment"])
    said = False

    def listener(event: Event) -> None:
        nonlocal said
        if isinstance(event, Polled) and not said:
            said = True
            print("POLLING", flush=True)

    with Executor(
        host, service=spec["service"], campaign=spec["campaign"], listener=listener
    ) as ex:
        result = ex.run(exp, run_id="killed-run")
    print("FINISHED", result.verdict.value, flush=True)  # only if nobody killed us
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
