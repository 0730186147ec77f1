"""Many partitions in one process: `picasso daily --dates START..END` (or with hours).

A backfill of a quarter, or a day of hourly runs, is a range of partitions. Run as
separate `picasso daily` processes, each pays the interpreter's, Beam's, the kernels' and
MLflow's start-up again, seconds that dwarf a small partition's training. Here one process
runs them in order: each partition is a daily run (pipelines/runs/daily.py), warm-started from
the one before, and ends as its own checkpoint and result file; every `publish_every`
partitions, and at the last, it becomes its own model version too.

With eval_next (test-then-train), each partition trains on all its rows and its version is
scored on the whole of the next partition with files (the single-date run's eval_date),
before that one trains. The last partition is scored on the partition right after the
range, the next day or hour; without files there, the range is refused before anything
trains, rather than scoring its last version another way: a scheduler then sees the
refusal and retries once that partition has landed, and every version of the range is
scored alike (a holdout score would stay in the record of a partition done).

Partitions are done once, as daily runs are: a re-run of the range skips the partitions
with a result and resumes at the first without. A partition that fails, or that the
run-health gate refuses (pipelines/runs/run_health.py), stops the range there: the partitions before it keep their results, the last of them is published if it
was only checkpointed, and RangeStopped says which partition failed and why. A partition
too small to score (a day of one row, or of one class) is not refused: it trains, is
done, makes no version and the range goes on; the next version covers it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from picasso import storage
from picasso.connectors.day_files import list_day_files
from picasso.connectors.partitions import MISSING_POLICIES, next_partition
from picasso.pipelines.runs.daily import (
    CHECKPOINTED, NOT_EVALUATED, REFUSED, DailyConfig, DailyResult, publish_checkpointed, run_daily)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RangeProgress:
    """Where a range stands after one more partition."""

    done: int  # partitions finished, those done before and missing ones included
    total: int
    result: DailyResult  # the partition just finished
    seconds: float  # since the range started
    rows_per_s: float  # rows trained and evaluated per second of the partitions trained here
    eta_s: float | None  # the partitions left at the pace of those trained so far; None before any


class PartitionRefused(Exception):
    """The run-health gate refused a partition (its result says why)."""

    def __init__(self, result: DailyResult):
        self.result = result
        super().__init__(result.refused)


class RangeStopped(Exception):
    """A partition failed; the range stopped there."""

    def __init__(self, partition: str, cause: BaseException, results: list[DailyResult]):
        self.partition, self.cause, self.results = partition, cause, results
        done = f"{len(results)} partition(s) before it are done" if results else "no partition is done"
        what = (f"was refused: {cause}" if isinstance(cause, PartitionRefused) else
                f"failed: {type(cause).__name__}: {cause}")
        super().__init__(f"partition {partition} {what} ({done}; run the same range again to resume at {partition})")


def run_range(template: DailyConfig, partitions: Sequence[str], publish_every: int = 1,
              on_partition: Callable[[RangeProgress], None] = lambda progress: None,
              missing: str = "fail", eval_next: bool = False) -> list[DailyResult]:
    """Daily runs of `partitions`, in order, in this process; template is every run's
    config but for its date (and its warm start after the first run: the partition before).

    missing: what a partition without files does: "fail" stops the range there, as any
    failure does; "skip" passes over it with a warning (real data has days without
    events), and it has no result.
    eval_next: score each partition's version on the next partition (see the module's
    docstring) instead of a holdout slice of its own."""
    if not partitions:
        raise ValueError("the range holds no partition")
    if missing not in MISSING_POLICIES:
        raise ValueError(f"missing partitions: one of {', '.join(MISSING_POLICIES)}, got {missing!r}")
    if publish_every < 1:
        raise ValueError(f"publish every N partitions needs N >= 1, got {publish_every}")
    if template.eval_date is not None:
        raise ValueError("an evaluation day is for one partition: a range scores each partition on the next with "
                         "eval_next (--eval-next), or on a holdout slice of its own")
    if len(set(partitions)) != len(partitions) or list(partitions) != sorted(partitions):
        raise ValueError("a range's partitions are distinct and in time order")
    absent = {p for p in partitions if missing == "skip" and not _has_files(template.data_root, p)}
    scored_on = _next_partitions(template, [p for p in partitions if p not in absent],
                                 after=next_partition(partitions[-1])) if eval_next else {}
    started, trained_seconds, trained, rows = time.perf_counter(), 0.0, 0, 0
    present = [p for p in partitions if p not in absent]  # a skipped partition is not one of the N
    results: list[DailyResult] = []
    for i, partition in enumerate(partitions):
        if partition in absent:
            log.warning("%s: no partition there, skipped (--missing skip)", partition)
            continue
        n = present.index(partition) + 1
        publish = n == len(present) or n % publish_every == 0
        config = replace(template, date=partition, publish=publish, eval_date=scored_on.get(partition))
        if results:
            config = replace(config, warm_start="latest")  # the partition before, whatever the first started from
        began = time.perf_counter()
        try:
            result = run_daily(config)
            if result.status == REFUSED:
                raise PartitionRefused(result)
        except Exception as err:  # noqa: BLE001 - any failure stops the range, and says where
            results = _publish_the_last(template, results)
            raise RangeStopped(partition, err, results) from err
        if not result.skipped:
            trained_seconds += time.perf_counter() - began
            trained += 1
            rows += result.samples + result.holdout_samples
        results.append(result)
        left = len(partitions) - i - 1
        on_partition(RangeProgress(
            done=i + 1, total=len(partitions), result=result, seconds=time.perf_counter() - started,
            rows_per_s=rows / trained_seconds if trained_seconds else 0.0,
            eta_s=trained_seconds / trained * left if trained else None))
    return _publish_the_last(template, results)


def _next_partitions(template: DailyConfig, partitions: list[str], after: str) -> dict[str, str]:
    """Each partition (those with files) -> the partition its version is scored on: the
    next of them, and for the last `after`, the one right after the range, which must have
    files unless the last is done already (a rerun then trains nothing and needs none)."""
    if not partitions:
        return {}
    last = partitions[-1]
    last_done = storage.exists(replace(template, date=last).record_path) and not template.force
    if not last_done and not _has_files(template.data_root, after):
        raise FileNotFoundError(
            f"scoring each partition on the next (--eval-next) scores the last, {last}, on {after}, which has no "
            f"files under {template.data_root}: run the range once {after} is there, or end it a partition earlier")
    return dict(zip(partitions, [*partitions[1:], after]))


def _has_files(root: str, partition: str) -> bool:
    try:
        list_day_files(root, partition)
    except FileNotFoundError:
        return False
    return True


def _publish_the_last(template: DailyConfig, results: list[DailyResult]) -> list[DailyResult]:
    """The last partition scored gets its version if it was only checkpointed (a range cut
    short by a failure, or one whose last partition was done, unpublished, by a longer one).
    Partitions after it too small to score have none to get: their training waits in the
    checkpoint for the next version, which covers them."""
    last = len(results) - 1
    while last >= 0 and results[last].status == NOT_EVALUATED:
        last -= 1
    if last >= 0 and results[last].status == CHECKPOINTED:
        log.info("publishing %s, the last partition scored", results[last].date)
        results = [*results[:last], publish_checkpointed(replace(template, date=results[last].date)),
                   *results[last + 1:]]
    return results
