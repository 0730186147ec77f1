"""The join section of a spec: how impression and label events are read and joined.

A spec file may carry, next to its fields, a `join:` section (every key optional):

    join:
      key: [request_id]        # the fields both events carry, that pair them up
      time: event_time_ms      # both events' event time, epoch milliseconds (an integer)
      label: label             # the label event's 0/1 field (default: the spec's label)
      wait: 15m                # W: how long an impression waits for its label
      late_labels: drop        # or correct (see picasso.sample_join.join_state)
      horizon: 15m             # how long past W a late label is still recognised
      orphan_grace: 1m         # how long a label waits for its impression
      allowed_lateness: 0s     # the watermark trails the partitions' newest time by this
      max_future: 1h           # an event time this far past its message's time is refused
      idle_after: 5m           # a partition with nothing to read this long stops holding the watermark (0s: never)

The FeatureSpec does not hold it: a model, its checkpoints and serving depend only on the
fields, so the join's settings can change without a new model. The section is validated
with the rest of the spec (picasso.spec.parse_spec), every problem named.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from picasso.durations import parse_duration_ms
from picasso.sample_join.join_policy import LATE_LABEL_POLICIES, JoinPolicy

_DURATIONS = {"wait": "wait_ms", "horizon": "horizon_ms", "orphan_grace": "orphan_grace_ms",
              "allowed_lateness": "allowed_lateness_ms", "max_future": "max_future_ms",
              "idle_after": "idle_after_ms"}
_KEYS = {"key", "time", "label", "late_labels", *_DURATIONS}


@dataclass(frozen=True)
class JoinSpec:
    key: tuple[str, ...] = ("request_id",)
    time_field: str = "event_time_ms"
    label_field: str | None = None  # None: the FeatureSpec's label
    wait_ms: int = 15 * 60_000
    late_labels: str = "drop"
    horizon_ms: int | None = None  # None: W again
    orphan_grace_ms: int = 60_000
    allowed_lateness_ms: int = 0
    max_future_ms: int = 3_600_000
    # Wall-clock time with nothing to read after which a partition stops holding the
    # bounded cycles' watermark (pipelines.runs.joined_stream_state.CycleClock), so that one
    # that stops receiving events does not stop the join; 0: never.
    idle_after_ms: int = 5 * 60_000

    def policy(self) -> JoinPolicy:
        return JoinPolicy(wait_ms=self.wait_ms, late_labels=self.late_labels, horizon_ms=self.horizon_ms,
                          orphan_grace_ms=self.orphan_grace_ms)

    def label_of(self, spec_label: str) -> str:
        return self.label_field or spec_label

    def replace(self, **changes) -> "JoinSpec":
        """A copy with the settings given (None values are left as they are): the command
        line's flags over the spec's section."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def parse_join(raw: Any, problems: list[str]) -> JoinSpec | None:
    """The JoinSpec of a spec's `join:` section, appending what is wrong to problems."""
    if raw is None:
        return JoinSpec()
    if not isinstance(raw, dict):
        problems.append(f"join: must be a mapping, got {type(raw).__name__}")
        return None
    before = len(problems)
    for key in sorted(set(raw) - _KEYS):
        problems.append(f"join: unknown key '{key}' (allowed: {', '.join(sorted(_KEYS))})")
    values: dict[str, Any] = {}
    key = raw.get("key", list(JoinSpec.key))
    key = [key] if isinstance(key, str) else key
    if not isinstance(key, list) or not key or not all(isinstance(k, str) and k for k in key):
        problems.append(f"join: 'key' must be a field name or a non-empty list of them, got {raw.get('key')!r}")
    elif len(set(key)) != len(key):
        problems.append(f"join: 'key' names a field twice: {key}")
    else:
        values["key"] = tuple(key)
    for name, attribute in (("time", "time_field"), ("label", "label_field")):
        if name in raw:
            if isinstance(raw[name], str) and raw[name]:
                values[attribute] = raw[name]
            else:
                problems.append(f"join: '{name}' must be a field name, got {raw[name]!r}")
    if "late_labels" in raw:
        if raw["late_labels"] in LATE_LABEL_POLICIES:
            values["late_labels"] = raw["late_labels"]
        else:
            problems.append(f"join: 'late_labels' must be one of {', '.join(LATE_LABEL_POLICIES)}, "
                            f"got {raw['late_labels']!r}")
    for name, attribute in _DURATIONS.items():
        if name in raw:
            try:
                values[attribute] = parse_duration_ms(raw[name])
            except ValueError as err:
                problems.append(f"join: '{name}': {err}")
    if "time_field" in values and values["time_field"] in values.get("key", JoinSpec.key):
        problems.append(f"join: the time field '{values['time_field']}' is also a key field")
    return JoinSpec(**values) if len(problems) == before else None
