"""The error tree. It follows the layers; lower-library errors are mapped at one boundary.

Every error carries one line for the user (`str(err)`) and, where there is one, a `hint`
saying what to try. The CLI prints both and picks the exit code from the class:
2 for usage and config errors, 3 for infrastructure, 1 for a campaign that did not conclude.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the exit code of a sweep that finished and found a regression against its previous run
#: (not an error: the sweep did its job, and a scheduler or CI can act on the code)
EXIT_REGRESSION = 5
#: a bisection's best answer is below the confidence asked (status `unsure`; its resume
#: goes on); not an error: the answer is printed as usual
EXIT_UNSURE = 4


@dataclass(frozen=True)
class CampaignRef:
    """Names a campaign to whoever resumes it: the CLI renders the resume command from it."""

    kind: str  # bisect | sweep
    campaign_id: str


class OrchestratorError(Exception):
    """Base of every error the program raises on purpose."""

    exit_code = 1
    #: set on an error that stopped a campaign the same command line can resume
    resumable: CampaignRef | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(OrchestratorError):
    """The command line asks for something that cannot be done."""

    exit_code = 2


class ConfigError(OrchestratorError):
    """A YAML file (experiment, hosts, scenario, sweep) is unreadable or invalid.

    `file` and `key` locate the problem; the message always names both when known.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = file or ""
        if key:
            where = f"{where}: {key}" if where else key
        full = f"{where}: {message}" if where else message
        super().__init__(full, hint=hint)
        self.file = file
        self.key = key
        self.reason = message


class PlanError(OrchestratorError):
    """The planner was asked something it cannot answer (e.g. configs do not differ)."""

    exit_code = 2


class InfraError(OrchestratorError):
    """The host or the path to it failed: not a verdict about the config."""

    exit_code = 3
    #: the host whose trouble it is, by its name in the hosts file, when known (a run over
    #: several hosts names the one that was lost, not the one the campaign runs it on)
    host: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, host: str | None = None) -> None:
        super().__init__(message, hint=hint)
        if host is not None:
            self.host = host


class TransportError(InfraError):
    """A command could not be run on the host (connection, auth, timeout)."""


class HostKeyError(TransportError):
    """The host key is unknown or has changed; never accepted silently."""


class CommandTimeout(TransportError):
    """A remote command ran past its timeout (and was killed on the host)."""


class ServiceError(InfraError):
    """The service manager refused an operation (missing unit, sudo refused, ...)."""


class SchedulerError(ServiceError):
    """A cluster's scheduler (Slurm) refused a job or could not be asked: an unknown
    partition, a gres it does not have, sbatch refusing the job (in its own words)."""


class LockError(InfraError):
    """Another orchestrator holds the host lock for this unit."""

    #: the campaign of the holder (None: unknown), so that a campaign refused by another
    #: one is recorded as `refused`, and one already running elsewhere is left alone
    holder_campaign: str | None = None


class StoreError(OrchestratorError):
    """The results store is unusable (read-only, full, corrupted)."""

    exit_code = 3


class CampaignIncomplete(OrchestratorError):
    """A campaign stopped before an answer (budget, deadline, endpoints wrong)."""

    exit_code = 1


class Interrupted(OrchestratorError):
    """A campaign was stopped by Ctrl-C, SIGTERM or SIGHUP; its hosts restored.

    Carries the outcome so far (`partial`: the findings and runs recorded before the stop),
    as picire's exceptions carry the best result found so far, and names the campaign so
    that the CLI can print the command that resumes it. `left`: per host, what the restore
    read back from it as still there (empty: as found; None: not read back, the restore
    was abandoned or the host could not be read).
    """

    exit_code = 130

    def __init__(
        self,
        campaign: CampaignRef,
        partial: Any = None,
        left: dict[str, list[str] | None] | None = None,
    ) -> None:
        super().__init__(f"{campaign.kind} campaign {campaign.campaign_id} interrupted")
        self.campaign = campaign
        self.resumable = campaign
        self.partial = partial
        self.left: dict[str, list[str] | None] = dict(left or {})

    @property
    def campaign_id(self) -> str:
        return self.campaign.campaign_id
