"""The sample join's policy: how long an impression waits for its label, and what a late
label does. Plain settings, checked when made, torch- and numpy-free (the command line
offers LATE_LABEL_POLICIES without loading the join: join_rules.py, which re-exports JoinPolicy).
"""

from __future__ import annotations

from dataclasses import dataclass

LATE_LABEL_POLICIES = ("drop", "correct")


@dataclass(frozen=True)
class JoinPolicy:
    wait_ms: int  # W
    late_labels: str = "drop"  # or "correct"
    horizon_ms: int | None = None  # remembered past W for late labels; None: W again
    orphan_grace_ms: int = 60_000  # how long a label waits for its impression, past its time

    def __post_init__(self):
        problems = []
        if not isinstance(self.wait_ms, int) or self.wait_ms < 0:
            problems.append(f"the label wait must be a whole number of ms >= 0, got {self.wait_ms!r}")
        if self.late_labels not in LATE_LABEL_POLICIES:
            problems.append(f"late labels must be one of {', '.join(LATE_LABEL_POLICIES)}, got {self.late_labels!r}")
        if self.horizon_ms is not None and (not isinstance(self.horizon_ms, int) or self.horizon_ms < 0):
            problems.append(f"the late-label horizon must be a whole number of ms >= 0, got {self.horizon_ms!r}")
        if not isinstance(self.orphan_grace_ms, int) or self.orphan_grace_ms < 0:
            problems.append(f"the orphan grace must be a whole number of ms >= 0, got {self.orphan_grace_ms!r}")
        if problems:
            raise ValueError("invalid join policy: " + "; ".join(problems))

    @property
    def keep_ms(self) -> int:
        """How long past its time an impression is remembered: a label later than this
        after its impression never joins it (beyond_horizon)."""
        return self.wait_ms + (self.wait_ms if self.horizon_ms is None else self.horizon_ms)

    @property
    def recall_ms(self) -> int:
        """How late after its impression an orphan label is still told that its impression
        came and was forgotten (recalled): the forgotten keys are kept one keep_ms more."""
        return 2 * self.keep_ms
