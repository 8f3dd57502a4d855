"""The Slurm backend: each variant is one `sbatch` job; the cluster's scheduler is the pool.

`jobscript` renders the job script (pure), `facts` parses what Slurm's clients print
(pure), `executor` submits, watches, cancels and judges jobs through the login node.
"""
