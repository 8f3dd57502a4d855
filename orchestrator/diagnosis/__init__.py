"""Diagnosis: from a server's log and a run's outcome to a verdict and a signature.

The classifier, the servers' log profiles, and the scoring of the classifier on labelled
real logs; the shared vocabulary (verdicts, phases, signatures) is `orchestrator/verdicts.py`.
"""
