"""How much a stale gradient counts: the decay function of GBA's token control.

A worker pulls parameters tagged with a token (the shard's global step then) and later
pushes the gradient it computed from them. Its staleness is tau = step_now - token: how
many optimizer steps the parameters moved while the gradient was being computed. For an
embedding row, tau counts only the steps that updated that row (rows change only when
their id occurs, so they go stale more slowly than dense weights).

The default, `StalenessDecay`:

    weight(tau) = 1                                   for tau <= tau_max
                = 0.5 ** ((tau - tau_max) / half_life) for tau_max < tau <= limit
                = 0  (dropped)                        for tau > limit

Up to tau_max a gradient is as good as a fresh one: with M local batches per global step
and workers of similar speed, a gradient typically arrives one or two steps after its pull,
and penalising those would penalise GBA's normal operation. Past tau_max it fades
exponentially, and past the hard limit it was computed against a model so old that it
would do harm, so it is dropped (and does not count towards the global batch).

`NO_DECAY` (weight 1 whatever the staleness, nothing dropped) is plain asynchronous
training's rule: the comparison baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StalenessDecay:
    tau_max: int = 2  # gradients at most this stale count fully
    half_life: float = 1.0  # past tau_max, the weight halves every half_life steps
    limit: int | None = 8  # gradients staler than this are dropped; None: never dropped

    def __post_init__(self):
        problems = []
        if self.tau_max < 0:
            problems.append(f"tau_max must be >= 0, got {self.tau_max}")
        if not self.half_life > 0:  # also refuses NaN
            problems.append(f"half_life must be > 0 (inf: no decay), got {self.half_life}")
        if self.limit is not None and self.limit < self.tau_max:
            problems.append(f"limit ({self.limit}) must be >= tau_max ({self.tau_max})")
        if problems:
            raise ValueError("bad staleness decay: " + "; ".join(problems))

    def dropped(self, staleness: int) -> bool:
        return self.limit is not None and staleness > self.limit

    def weight(self, staleness: int) -> float:
        """The factor a gradient this stale is multiplied by (0 when it is dropped)."""
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness} (a token from the future?)")
        if self.dropped(staleness):
            return 0.0
        if staleness <= self.tau_max:
            return 1.0
        return 0.5 ** ((staleness - self.tau_max) / self.half_life)

    def describe(self) -> str:
        """The form parse_decay reads back."""
        if self == NO_DECAY:
            return "none"
        limit = "none" if self.limit is None else str(self.limit)
        return f"exp:tau_max={self.tau_max},half_life={self.half_life:g},limit={limit}"


NO_DECAY = StalenessDecay(tau_max=0, half_life=math.inf, limit=None)

_KEYS = {"tau_max": int, "half_life": float, "limit": lambda v: None if v == "none" else int(v)}


def parse_decay(text: str) -> StalenessDecay:
    """'none', 'exp' (the defaults) or 'exp:tau_max=2,half_life=1,limit=8' (any subset of
    keys; limit=none never drops). Errors name the bad part."""
    text = text.strip()
    if text == "none":
        return NO_DECAY
    kind, _, options = text.partition(":")
    if kind != "exp":
        raise ValueError(f"bad staleness decay {text!r}: the kind must be 'exp' or 'none', got {kind!r}")
    values = {}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in _KEYS:
            raise ValueError(f"bad staleness decay {text!r}: {item!r} is not one of "
                             f"{', '.join(k + '=...' for k in _KEYS)}")
        try:
            values[key] = _KEYS[key](value)
        except ValueError:
            raise ValueError(f"bad staleness decay {text!r}: {key} takes a number, got {value!r}") from None
    return StalenessDecay(**values)
