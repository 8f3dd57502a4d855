"""Campaigns: many runs toward one answer, recorded and resumable.

What every campaign shares (`core`: the record created or resumed by key, budgets, the
host-trouble streak, cache hits, interrupts) and its typed records (`records`); bisections,
sweeps and single runs built on it; the host pools that run them in parallel, planning from
two config files, flaky-failure handling, reruns, environment watching and schedules.
"""
