"""The Slurm backend: each variant is one `sbatch` job; the cluster's scheduler is the pool.

`jobscript` renders the job script (pure), `facts` parses what Slurm's clients print
(pure), `executor` submits and cancels jobs through the login node, `jobwatch` watches
one to its end and reads back what it left, `settle` judges it, `leftovers` finds what
controllers that stopped left on the cluster, `check` asks whether the cluster can run
the jobs (`hosts check`, and each campaign's start), `multinode` runs a deployment's
node ranks as one job.
"""
