"""The keys of impressions the join forgot, with their times, for a while after.

Past its horizon the join drops an impression's record (picasso.sample_join.join_state), and a
label that comes later finds nothing: it leaves as an orphan. Its dead letter should say
why: was the impression never seen, or seen and forgotten at the horizon? Only the
impression's key and time are needed for that, so the join keeps those two, 16 bytes per
forgotten impression, for one more span of W + horizon (join_rules.recalled), instead of
the record itself (its features, its state and a dict entry: ten or more times that).

Why not a set, or a Bloom filter? A Python set costs about 60 bytes per key; a Bloom
filter is smaller but would now and then tell an orphan that its impression was forgotten
when it never came. Sorted numpy runs cost 16 bytes a key and answer exactly.

Keys come in forget order, about time order, a batch per forget; each batch is a run
sorted by (key, time), and two neighbouring runs are merged whenever the newer one is as
large as the older (a binary counter): O(log n) runs, so a lookup costs a few binary
searches. A merge leaves out the keys no orphan can be told about any more, and a run
goes as a whole once its newest time is past the memory; until then some of its keys stay
longer than needed, which changes no answer (callers judge a found time by
join_rules.recalled), only how soon their bytes go.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOT_FOUND = -1  # impression_times' answer for a key with no time remembered
_OLDEST = np.iinfo(np.int64).min


class ForgottenKeys:
    def __init__(self):
        self._runs: list[_Run] = []  # in forget order
        self._since = _OLDEST  # older times are no longer needed (forget_before)

    def __len__(self) -> int:
        return sum(len(run.keys) for run in self._runs)

    @property
    def nbytes(self) -> int:
        return 16 * len(self)

    def add(self, keys: np.ndarray, times: np.ndarray) -> None:
        if not len(keys):
            return
        self._runs.append(_Run.of(np.asarray(keys, np.uint64), np.asarray(times, np.int64)))
        while len(self._runs) >= 2 and len(self._runs[-1].keys) >= len(self._runs[-2].keys):
            newer, older = self._runs.pop(), self._runs.pop()
            keys, times = np.concatenate([older.keys, newer.keys]), np.concatenate([older.times, newer.times])
            keep = times >= self._since
            if keep.any():
                self._runs.append(_Run.of(keys[keep], times[keep]))

    def impression_times(self, keys: np.ndarray) -> np.ndarray:
        """The newest time remembered for each key; NOT_FOUND where none is."""
        keys = np.asarray(keys, np.uint64)
        found = np.full(len(keys), NOT_FOUND, np.int64)
        for run in self._runs if len(keys) else ():
            # The last entry of a key's span in a run sorted by (key, time) is its newest.
            at = np.searchsorted(run.keys, keys, side="right") - 1
            hit = (at >= 0) & (run.keys[np.maximum(at, 0)] == keys)
            found[hit] = np.maximum(found[hit], run.times[at[hit]])
        return found

    def forget_before(self, time: int) -> None:
        """Times older than `time` are needed no more: drop the runs that hold only those."""
        self._since = max(self._since, time)
        self._runs = [run for run in self._runs if run.newest >= time]

    def entries(self, since: int) -> tuple[np.ndarray, np.ndarray]:
        """Every (key, time) with a time at or after `since`, sorted by (time, key): the
        same whatever the runs were cut into, for a checkpoint that must not depend on it."""
        if not self._runs:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64)
        keys = np.concatenate([run.keys for run in self._runs])
        times = np.concatenate([run.times for run in self._runs])
        keep = times >= since
        keys, times = keys[keep], times[keep]
        order = np.lexsort((keys, times))
        return keys[order], times[order]


@dataclass(frozen=True)
class _Run:
    keys: np.ndarray  # uint64, sorted by (key, time)
    times: np.ndarray  # int64
    newest: int

    @classmethod
    def of(cls, keys: np.ndarray, times: np.ndarray) -> "_Run":
        order = np.lexsort((times, keys))
        return cls(keys[order], times[order], int(times.max()))
