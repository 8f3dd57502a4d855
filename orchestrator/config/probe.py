"""A probe: the benchmark run on a ready server, its metric read from the output, its
bar, and how many times one start runs it (`repeats`, after `warmup` discarded runs)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from orchestrator.config.schema import Condition, parse_condition

#: runs kept from one start and runs discarded before them (vLLM's perf-eval keeps three
#: after a warm-up): one run of a serving benchmark varies by more than the effects chased
DEFAULT_REPEATS = 3
DEFAULT_WARMUP = 1


@dataclass(frozen=True)
class Probe:
    run: str
    metric: str | None = None
    pass_if: str | None = None
    timeout: float = 600.0
    #: benchmark runs kept from one start (their median is the start's metric) and the
    #: runs before them discarded as warm-up: one run of a serving benchmark is noise
    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP

    @property
    def condition(self) -> Condition | None:
        return parse_condition(self.pass_if) if self.pass_if else None

    @property
    def runs(self) -> int:
        """How many times one start runs the probe command (warm-up included)."""
        return self.warmup + self.repeats

    @property
    def bar(self) -> float | None:
        """The smallest effect that matters, as a share, from a bar relative to good
        (`>= 0.95 * good`: 0.05; `<= 1.1 * good`, a latency: 0.10); None otherwise."""
        cond = self.condition
        if cond is None or not cond.relative_to_good or cond.op not in (">=", ">", "<=", "<"):
            return None
        share = 1 - cond.number if cond.op in (">=", ">") else cond.number - 1
        return share if 0 < share < 1 else None

    @property
    def higher_is_better(self) -> bool:
        """A bar from below (`>=`) guards a throughput; from above (`<=`) a latency."""
        cond = self.condition
        return cond is None or cond.op in (">=", ">")

    def judge(
        self, figures: list[float], good_metric: float | None
    ) -> tuple[float | None, bool | None]:
        """One start's metric (the median after the warm-up) and whether it meets the bar,
        as `read` says of one figure."""
        metric = self.value(figures)
        cond = self.condition
        if cond is None:
            return metric, None
        if metric is None:
            return None, False
        if cond.relative_to_good and good_metric is None:
            return metric, None
        return metric, cond.holds(metric, good_metric)

    def value(self, figures: list[float]) -> float | None:
        """One start's metric: the median of its runs after the warm-up."""
        kept = figures[self.warmup :] or figures[-1:]
        return statistics.median(kept) if kept else None

    def command(self, port: int) -> str:
        return self.run.replace("{port}", str(port))

    def read(self, output: str, good_metric: float | None) -> tuple[float | None, bool | None]:
        """The metric (the metric regex's last match in `output`) and whether it meets the
        bar: False when there is a bar and no metric; None when the bar is relative to the
        good config's metric and that is not known yet (the campaign decides later)."""
        metric = None
        if self.metric:
            found = re.findall(self.metric, output)
            if found:
                last = found[-1]
                try:
                    metric = float(last if isinstance(last, str) else last[0])
                except ValueError:
                    metric = None
        cond = self.condition
        if cond is None:
            return metric, None
        if metric is None:
            return None, False
        if cond.relative_to_good and good_metric is None:
            return metric, None
        return metric, cond.holds(metric, good_metric)
