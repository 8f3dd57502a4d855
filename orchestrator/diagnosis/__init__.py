"""Diagnosis: from a server's log and a run's outcome to a verdict and a signature.

The shared vocabulary (verdicts, phases, signatures), the classifier, the servers' log
profiles, and the scoring of the classifier on labelled real logs.
"""
