"""The lab: a simulated SGLang-like inference server, its bench client and scenarios.

`python3 -m orchestrator.lab.server --scenario NAME [server flags...]` behaves like
`python -m sglang.launch_server`: it prints SGLang's startup lines, serves `/health` once
ready and fails by the scenario's rules. `python3 -m orchestrator.lab.bench` measures it
the way `sglang.bench_serving` does. Both run on a bare python3 with PyYAML only, so the
modules of this package that they import use nothing beyond the standard library and yaml.
"""

from __future__ import annotations
