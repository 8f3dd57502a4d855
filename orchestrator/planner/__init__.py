"""The planner: pure search over the differences between a good and a bad config.

No I/O, no clock, no printing, no randomness it is not given. `deltas` diffs two
configs; a strategy (`linear`, `dd`, `auto`, `noisy`: `strategies.STRATEGIES`) is a
generator that proposes rounds of variants and receives verdicts; `Planner` drives it,
caches verdicts, retries `infra`, and closes variants under coupling rules. `noisy`
(modules `noisy`, `batch`) keeps a posterior over culprit sets for failures that
reproduce only sometimes; `adaptive` runs `auto` and switches to it once the runs show
flakiness.

The default search, end to end (`orchestrator bisect` with no `--strategy`; the
campaign's side is `campaign/bisect.py`, its flaky parts `campaign/flaky.py`):

1. First the endpoints. Both configs' flags are put to each host's server before anything
   starts (flags its own parser refuses stop the campaign before its first start). Then
   good and bad run, side by side on two hosts (good first, alone, when the probe's bar is
   relative to good's metric). Good must pass: a failure of good is proof, never noise,
   and ends the campaign. Bad must fail: while it has only passed it is started again, up
   to `adaptive.BAD_ATTEMPTS` (16) starts, since a flaky failure may need several to show.
   Runs that earlier campaigns recorded of the same launch, under the inputs the hosts
   have now, count as runs and are not started again (`--fresh`: none are reused).
2. How a failure is confirmed. The signature of bad's failure is the target: a run fails
   only when its signature is the target's (across builds: the same error class and
   message in any startup phase); any other failure is `other`, kept as a finding of its
   own, and clears a variant like a pass does. `infra` says nothing about the config: the
   variant runs again. A culprit set is confirmed by runs of exactly the variants the
   answer names: good + the set fails with the target, and bad without each member does
   not (`--repeat N` runs those variants again and reports any that disagree).
3. The search is `adaptive.Adaptive`: `strategies.auto` (a prefix search for the last
   delta a failure needs, a partner search before it, minimality, then bad without each
   member, so further independent causes are found too) while every run agrees. As soon
   as the runs contradict each other (a variant that both failed and passed, a pass of a
   superset of a failing variant, an answer a recorded run disagrees with), it turns into
   the noise-aware search (`noisy`) with every run so far as evidence. That search keeps
   a posterior over culprit sets of one to three deltas with the reproduction rate
   integrated out: a target failure is proof, a pass only evidence. It runs the variant
   with the most expected information about the culprit set (with several hosts or Slurm
   jobs, `batch` fills each free slot with what adds most to the runs in progress; idle
   hosts may run ahead on variants the search will want whatever the runs in progress
   show). `auto`'s own answer is weighed by the same posterior, so every answer carries
   one confidence.
4. It stops when the answer's confidence (its posterior, times the chance that no other
   cause hides behind it) reaches `--confidence` (0.95), or when `--max-runs`,
   `--deadline` or the noise model's run budget ends: the answer is then `unsure` (the
   best one and its confidence, with the runs a resume would do next) or `incomplete`
   (how far it narrowed). The whole search is a function of the recorded runs, so a
   resumed campaign takes the same path.
5. Repair: a run that died of a resource (`verdicts.RESOURCE_CLASSES`: CUDA out of
   memory, a KV cache too small; never the target failure) is started again with one
   move of the repair policy (`config.repair`: built in, the host's, the experiment
   files'; `--no-repair`: none) until it settles (`repair.decide`). The search sees only
   the start the ladder settles on; the superseded starts are no evidence.
6. Ordered deltas: with `--builds`, the builds between good's and bad's are one ordered
   axis (`ordered.Ordered` wraps the strategy): the builds are bisected with bad's flags
   first, as git bisect does, then the flags are searched on the first failing build
   (or on good's, when the build does not matter) and each set is named with it.
"""

from __future__ import annotations

from orchestrator.planner.adaptive import Adaptive
from orchestrator.planner.batch import NoisyFromStart
from orchestrator.planner.core import (
    Answer,
    Culprit,
    Planner,
    Round,
    StrategyFn,
    Variant,
)
from orchestrator.planner.deltas import Delta, apply_deltas, coupling_closure, diff
from orchestrator.planner.strategies import STRATEGIES, estimate_runs, make_strategy

__all__ = [
    "STRATEGIES",
    "Adaptive",
    "NoisyFromStart",
    "Answer",
    "Culprit",
    "Delta",
    "Planner",
    "Round",
    "StrategyFn",
    "Variant",
    "apply_deltas",
    "coupling_closure",
    "diff",
    "estimate_runs",
    "make_strategy",
]
