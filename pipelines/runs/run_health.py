"""The run-health gate: whether what a run trained may become a model version.

A run can finish without an error and still have learned nothing: a label named wrong
makes every row a dead letter, and a version of the untrained model is then registered
and the partition marked done, so a scheduler sees success. The gate stands between
training and the two things that cannot be taken back, marking a partition done and
publishing a version, in every mode: a daily partition (and so each partition of a
range), a stream's version, and the endless job's.

It REFUSES (no version, the partition stays to be done) when
- no sample was trained;
- the dead letters' share of the rows read is above max_dead_letter_share;
- the AUC or a loss is not finite (NaN: nothing evaluated, or a model that diverged).

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

from picasso.pipelines.transforms.row_profile import RowProfile

HEALTH_WARNINGS = "picasso.health_warnings"  # the version's tag that carries the warnings
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

    def __post_init__(self):
        for name in ("max_dead_letter_share", "max_missing_share"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name.replace('_', '-')} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class HealthFacts:
    """What the gate judges: one partition's, one stream cycle's, or a stream window's."""

    trained: int  # samples trained on
    rows_read: int  # valid rows and dead letters
    dead_letters: int
    losses: dict[str, float] = field(default_factory=dict)  # auc, logloss, train_loss: each must be finite
    profile: RowProfile | None = None  # None: no warnings about fields and labels

    def merge(self, other: "HealthFacts") -> "HealthFacts":
        """Two stretches of a stream, one after the other (the later one's losses hold)."""
        profile = other.profile if self.profile is None else (
            self.profile if other.profile is None else self.profile.merge(other.profile))
        return HealthFacts(self.trained + other.trained, self.rows_read + other.rows_read,
                           self.dead_letters + other.dead_letters, {**self.losses, **other.losses}, profile)


@dataclass(frozen=True)
class HealthVerdict:
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

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
    if facts.trained <= 0:  # which says it all: the share and the losses follow from it
        refusals.append(f"no sample trained ({facts.rows_read:,} rows read, {facts.dead_letters:,} dead letters)")
    else:
        if facts.rows_read and facts.dead_letters / facts.rows_read > limits.max_dead_letter_share:
            refusals.append(f"{facts.dead_letters / facts.rows_read:.1%} of the rows read are dead letters "
                            f"({facts.dead_letters:,} of {facts.rows_read:,}; --max-dead-letter-share "
                            f"{limits.max_dead_letter_share:g})")
        for name, value in facts.losses.items():
            if value is None or not math.isfinite(value):
                refusals.append(f"{name} is not finite ({value})")
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
    return HealthVerdict(tuple(refusals), tuple(warnings))
