"""Campaigns: many runs toward one answer, recorded and resumable.

Bisections and sweeps, the host pools that run them in parallel, planning from two config
files, flaky-failure handling, reruns, environment watching and schedules.
"""
