"""Configuration files: experiment configs and the hosts inventory.

YAML is validated with pydantic v2 (unknown keys are errors); inside the program the
results are frozen plain objects (`Experiment`, `Host`, `Inventory`).
"""

from __future__ import annotations

from orchestrator.config.experiment import Experiment, FlagValue, Health, Probe
from orchestrator.config.hosts import Host, Inventory, load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.config.schema import parse_duration

__all__ = [
    "Experiment",
    "FlagValue",
    "Health",
    "Host",
    "Inventory",
    "Probe",
    "load_experiment",
    "load_inventory",
    "parse_duration",
]
