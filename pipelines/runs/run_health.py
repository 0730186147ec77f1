"""The run-health gate: whether what a run trained may become a model version.

A run can finish without an error and still have learned nothing: a label named wrong
makes every row a dead letter, and a version of the untrained model is then registered
and the partition marked done, so a scheduler sees success. The gate stands between
training and the two things that cannot be taken back, marking a partition done and
publishing a version, in every mode: a daily partition (and so each partition of a
range), a stream's version, and the endless job's.

It REFUSES (no version, the partition stays to be done) when
- no sample was trained although rows were read, because they were dead letters (a label
  named wrong);
- the dead letters' share of the rows read is above max_dead_letter_share;
- the training loss is not finite, or the AUC or log loss is not finite although the
  evaluation rows held both classes (a model that diverged);
- the training loss or the log loss is above max_loss: a model that diverged without
  reaching NaN (scores saturated at 0 and 1, each wrong one costing the clip's 16 nats).

It says NOT EVALUATED, and refuses nothing, when the evaluation rows are empty or of one
class: a partition of a few rows, a day of one class. Nothing is wrong with such a
partition, only too small to score: the rule that an AUC must be finite was meant for a
model that diverged, not for a slice without both classes, and refusing it stopped a
real backfill for good at a day of one row. It trains and is done, and makes no version
that would claim a metric it does not have; the next evaluable one does, and covers it.
A partition that read no row at all trained nothing and is done in the same way.

It WARNS (on the console and as the version's tag HEALTH_WARNINGS) when
- a field of the spec is absent (null or missing) in more than max_missing_share of the
  rows trained on: most likely a field misspelled in the spec, or one the producer
  stopped sending; the model then learns from empty bags and zeros;
- the label is constant over the rows: nothing to tell apart. Labels in [0, 1] count as
  clicks from 0.5 (RowProfile.positives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation alone: the command line takes HealthLimits' defaults without pyarrow
    from picasso.pipelines.transforms.row_profile import RowProfile

HEALTH_WARNINGS = "picasso.health_warnings"  # the version's tag that carries the warnings
EVALUATION_LOSSES = ("auc", "logloss")  # measured on the evaluation rows; the others on training


@dataclass(frozen=True)
class EvaluationRows:
    """How many rows a version is scored on, and how many of them are clicks."""

    rows: int
    positives: int
    kind: str = "held-out"  # how the rows were kept for scoring: held-out (daily), scored (a stream's window)

    @property
    def evaluable(self) -> bool:
        return 0 < self.positives < self.rows

    def describe(self) -> str:
        """Why there is no score: `not evaluated (2 held-out rows, one class)`."""
        one_class = ", one class" if self.rows else ""
        return f"not evaluated ({self.rows:,} {self.kind} row{'' if self.rows == 1 else 's'}{one_class})"


@dataclass(frozen=True)
class HealthLimits:
    # 0.5: above it most of what was read is not in the model, which then describes a
    # biased remnant; yet it is far above the share a healthy feed refuses (well under a
    # percent), so a producer's passing glitch does not hold back a version, while a wrong
    # label, format or spec (every row refused) always does.
    max_dead_letter_share: float = 0.5
    # 0.99: a sparse field present in one row of a hundred is rare, not broken; absent from
    # more, it is most likely a name the data does not have.
    max_missing_share: float = 0.99
    # 3 nats a sample: a constant guess scores at most ln 2 (0.69) and a model that learned
    # anything less, while one that diverged (a learning rate of 1e6 here) averages 7e18 in
    # training and 13 on its evaluation rows. A bad early step or a day of odd data stays
    # far below it.
    max_loss: float = 3.0

    def __post_init__(self):
        for name in ("max_dead_letter_share", "max_missing_share"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name.replace('_', '-')} must be in [0, 1], got {value}")
        if not self.max_loss > 0:
            raise ValueError(f"max-loss must be above 0, got {self.max_loss}")


@dataclass(frozen=True)
class HealthFacts:
    """What the gate judges: one partition's, one stream cycle's, or a stream window's."""

    trained: int  # samples trained on
    rows_read: int  # valid rows and dead letters
    dead_letters: int
    losses: dict[str, float] = field(default_factory=dict)  # auc, logloss, train_loss: each must be finite
    profile: RowProfile | None = None  # None: no warnings about fields and labels
    evaluation: EvaluationRows | None = None  # None: these facts hold no evaluation (a stream's cycle)

    def merge(self, other: "HealthFacts") -> "HealthFacts":
        """Two stretches of a stream, one after the other (the later one's losses hold)."""
        profile = other.profile if self.profile is None else (
            self.profile if other.profile is None else self.profile.merge(other.profile))
        return HealthFacts(self.trained + other.trained, self.rows_read + other.rows_read,
                           self.dead_letters + other.dead_letters, {**self.losses, **other.losses}, profile,
                           other.evaluation or self.evaluation)


@dataclass(frozen=True)
class HealthVerdict:
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    not_evaluated: str | None = None  # why there is no score (EvaluationRows.describe); None: scored

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    @property
    def reason(self) -> str:
        """The refusals in one line."""
        return "; ".join(self.refusals)

    def tags(self) -> dict[str, str]:
        """The version's tags: the warnings, when there are any."""
        return {HEALTH_WARNINGS: "; ".join(self.warnings)} if self.warnings else {}


def check_health(facts: HealthFacts, limits: HealthLimits, fields: tuple[str, ...] = ()) -> HealthVerdict:
    """The gate's verdict. `fields`: the spec's feature names, in order, whose absence is checked."""
    refusals = []
    evaluation = facts.evaluation
    not_evaluated = None if evaluation is None or evaluation.evaluable else evaluation.describe()
    if facts.trained <= 0 and facts.dead_letters > 0:  # which says it all: the share and the losses follow
        refusals.append(f"no sample trained ({facts.rows_read:,} rows read, {facts.dead_letters:,} dead letters)")
    else:
        if facts.rows_read and facts.dead_letters / facts.rows_read > limits.max_dead_letter_share:
            refusals.append(f"{facts.dead_letters / facts.rows_read:.1%} of the rows read are dead letters "
                            f"({facts.dead_letters:,} of {facts.rows_read:,}; --max-dead-letter-share "
                            f"{limits.max_dead_letter_share:g})")
        for name, value in facts.losses.items():
            if not _measured(name, facts, evaluation):
                continue
            if value is None or not math.isfinite(value):
                refusals.append(f"{name} is not finite ({value})")
            elif name != "auc" and value > limits.max_loss:
                refusals.append(f"{name} is {value:.4g}, above --max-loss {limits.max_loss:g} (a model that diverged)")
    warnings = []
    profile = facts.profile
    if profile is not None and profile.rows:
        for name in fields:
            share = profile.absent.get(name, 0) / profile.rows
            if share > limits.max_missing_share:
                warnings.append(f"field '{name}' is absent in {share:.1%} of the rows (--max-missing-share "
                                f"{limits.max_missing_share:g})")
        if profile.positives in (0, profile.rows):
            warnings.append(f"the label is constant ({'all' if profile.positives else 'no'} clicks in "
                            f"{profile.rows:,} rows)")
    return HealthVerdict(tuple(refusals), tuple(warnings), not_evaluated)


def _measured(loss: str, facts: HealthFacts, evaluation: EvaluationRows | None) -> bool:
    """Whether a loss had anything to be measured on, so that NaN means a broken model:
    the training loss once a sample trained; the log loss on any evaluation row; the AUC
    on rows of both classes."""
    if loss not in EVALUATION_LOSSES:
        return facts.trained > 0
    if evaluation is None:
        return True
    return evaluation.evaluable if loss == "auc" else evaluation.rows > 0
