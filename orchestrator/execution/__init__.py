"""Execution: runs one variant on one host, and is the only code that touches hosts.

The executor, the host lock, host operations outside a campaign (check, restore), the
flag preflight, facts (pure parsers of host command output), the host environment, and
the transports and service managers they drive; `slurm/` runs each variant as a job on a
Slurm cluster through the same executor contract.
"""
