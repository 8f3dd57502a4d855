"""Reuse of recorded runs: a variant's verdict taken from a run already recorded, by this
campaign or (not `--fresh`) by earlier ones, instead of a new start.

A start recorded by another campaign is reused only for the same launch: the config's
fingerprint and what would reach its server on a host of the pool now (`LaunchInputs`,
read on the host). Every such start this campaign has not taken yet is recorded as one
of its runs (purpose `cache`), so the search and the answer stand on all of them, as a
resume does; why runs were not reused is said once per reason.
"""

from __future__ import annotations

from orchestrator.campaign.core import CachedResult
from orchestrator.campaign.pool import Pool
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.classify.judge import (
    LAUNCH_CLASS,
    OUTSIDE_SIGNALS,
    RunEvidence,
    launch_failure,
)
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.events import Listener, Notice
from orchestrator.execution.inputs import LaunchInputs
from orchestrator.planner.repair import Applied
from orchestrator.store.store import RunRow


class RecordedRuns:
    """The verdicts a campaign takes from recorded runs, and how many it took (`reused`)."""

    def __init__(self, campaign: BisectionRuns, emit: Listener, *, fresh: bool) -> None:
        #: the runs of the campaign it serves
        self.campaign = campaign
        self.emit = emit
        #: --fresh: nothing earlier campaigns recorded is reused
        self.fresh = fresh
        self.reused = 0
        self._told: set[str] = set()  # why recorded runs were not reused, said once

    def known(
        self, variant: tuple[int, ...], target: Signature | None, pool: Pool, *, again: bool = False
    ) -> RunRow | None:
        """This campaign's recorded verdict of the variant (unless a new start is wanted:
        `again`), else the starts earlier campaigns recorded of the same launch (not
        --fresh): the config's fingerprint and what would reach its server on a host of
        the pool now (`LaunchInputs`, read on the host). Every such start this campaign
        has not taken yet is recorded as a reused run; the newest is returned."""
        if not again:
            mine = [
                r
                for r in self.campaign.rows()
                if r.variant == variant and r.verdict is not Verdict.INFRA
            ]
            if mine:
                return self.campaign.relabel(mine[-1], target, "resume")
        exp = self.campaign.plan.variant(frozenset(variant))
        return self.from_cache(variant, exp, target, pool)

    def from_cache(
        self,
        variant: tuple[int, ...],
        exp: Experiment,
        target: Signature | None,
        pool: Pool,
        *,
        repair: Applied | None = None,
    ) -> RunRow | None:
        """The starts earlier campaigns recorded of the launch `exp` (see `known`); a
        repaired start (`repair`: the move it carries) takes the newest one alone, which
        continues this variant's ladder."""
        if self.fresh or not self.reusable_config(exp):
            return None
        fp = exp.fingerprint()
        taken = {r.cached_from for r in self.campaign.launch_rows() if r.cached_from}
        for host in pool.healthy_hosts():
            left = (
                self.campaign.store.reuse_candidates(
                    fp, host.host_class, exclude_campaign=self.campaign.cid
                )
                - taken
            )
            if not left:
                continue  # nothing (left) to reuse: the host need not be asked
            inputs = pool.inputs_of(host, exp)
            if inputs is None:
                continue  # busy, or it cannot tell what would reach the server: unknown
            hits = [
                h
                for h in self.campaign.store.reusable(
                    inputs.key(fp), exclude_campaign=self.campaign.cid
                )
                if h.id not in taken and self.reusable_run(h)
            ]
            hits = self.current(hits)
            if not hits:
                self._not_reused(variant, host, inputs, left)
                continue
            label = (
                self.campaign.label(variant)
                if repair is None
                else self.campaign.repaired_label(variant, repair)
            )
            if repair is not None:
                hits = hits[-1:]  # one start continues a ladder
            row: RunRow | None = None
            for hit in hits:  # oldest first: the newest is this campaign's last word on it
                cached = CachedResult.from_row(hit, label, host, exp, inputs)
                row = self.campaign.record(
                    cached,
                    variant=variant,
                    purpose="cache",
                    cached_from=hit.id,
                    repair=repair.to_dict() if repair else None,
                )
                self.reused += 1
                if hit is not hits[-1]:
                    self.campaign.relabel(row, target, "cache")
            assert row is not None
            return self.campaign.relabel(row, target, "cache")
        return None

    def reuse_recorded(self, pool: Pool) -> None:
        """Before the search: every start that earlier campaigns recorded of a variant of
        this pair, under the inputs the hosts have now, joins this campaign's runs, the
        variants the search will not ask for included: the posterior, the reproduction
        rate and the confidence stand on all the recorded runs, as the first campaign's
        did (a rerun that read only what it asked for would drop some passes)."""
        if self.fresh:
            return
        n = self.campaign.plan.n
        wanted: set[tuple[int, ...]] = set()
        for cls in dict.fromkeys(h.host_class for h in pool.healthy_hosts()):
            for variant, fp in self.campaign.store.recorded_launches(
                cls, exclude_campaign=self.campaign.cid
            ):
                if variant in wanted or any(i >= n for i in variant):
                    continue
                if self.campaign.plan.variant(frozenset(variant)).fingerprint() == fp:
                    wanted.add(variant)  # the same launch as this pair's variant
        for variant in sorted(wanted, key=lambda v: (len(v), v)):
            self.known(variant, self.campaign.target, pool, again=True)

    def _not_reused(
        self, variant: tuple[int, ...], host: Host, inputs: LaunchInputs, ids: set[str]
    ) -> None:
        """Say once per campaign and reason why recorded runs of a variant were not reused
        (what reaches the server differs now), so a cold cache is no mystery."""
        exp = self.campaign.plan.variant(frozenset(variant))
        old = self.campaign.store.runs_of(exp.fingerprint(), host.host_class, ids)
        if not inputs.known:
            why = f"what would reach the server cannot be read on {host.name} now"
        else:
            parts = sorted(
                {d for r in old if r.inputs is not None for d in inputs.differences(r.inputs)}
            )
            why = "changed since they ran: " + "; ".join(parts) if parts else ""
        if not why or why in self._told:
            return
        self._told.add(why)
        self.emit(
            Notice(
                host=host.name,
                message=(
                    f"{len(old)} recorded run(s) of "
                    f"{self.campaign.plan.describe(frozenset(variant))} not reused: {why}"
                ),
            )
        )

    @staticmethod
    def reusable_config(exp: Experiment) -> bool:
        """A verdict judged against another campaign's good (its throughput, its answers)
        cannot be reused: this campaign's good is the reference."""
        if exp.answers is not None and exp.answers.enabled:
            return False
        cond = exp.probe.condition if exp.probe else None
        return cond is None or not cond.relative_to_good

    @staticmethod
    def current(hits: list[RunRow]) -> list[RunRow]:
        """The recorded starts of one launch (oldest first) that still speak for it: an
        `invalid` (refused before the server ran) recorded before a start of the same
        launch that ran is over: whatever refused it was fixed since."""
        ran = [i for i, h in enumerate(hits) if h.verdict is not Verdict.INVALID]
        if not ran:
            return hits
        return [h for i, h in enumerate(hits) if h.verdict is not Verdict.INVALID or i > ran[-1]]

    @staticmethod
    def reusable_run(hit: RunRow) -> bool:
        """Nor one recorded before kills from outside were told apart (a bare SIGKILL/SIGTERM
        with no failure in the log: today such a run is infra). Nor a launch that never
        reached the server (a build not installed, a typo'd exec): whether its command can
        run is the host's state of the moment, not the config's verdict; one recorded before
        such launches were told apart (a `fail` at init) is known by its log alone (the
        launcher's cannot-run line, no startup), its exit status not being kept."""
        sig = hit.signature
        if sig is None:
            return True
        if sig.error_class == LAUNCH_CLASS:
            return False
        if hit.verdict in (Verdict.FAIL, Verdict.OTHER) and sig.phase is Phase.INIT:
            assumed = RunEvidence(log_tail=hit.log_tail(), exit_code=127)
            if launch_failure(assumed) is not None:
                return False
        return not (sig.error_class == "signal" and sig.message in OUTSIDE_SIGNALS)


__all__ = ["RecordedRuns"]
