"""The forgotten keys the join keeps to tell an orphan why (picasso.forgotten_keys)."""

import numpy as np

from picasso.forgotten_keys import NOT_FOUND, ForgottenKeys


def filled(batches) -> ForgottenKeys:
    keys = ForgottenKeys()
    for batch_keys, batch_times in batches:
        keys.add(np.array(batch_keys, np.uint64), np.array(batch_times, np.int64))
    return keys


def test_each_key_answers_its_newest_time_however_the_batches_came():
    rng = np.random.default_rng(0)
    keys, times = rng.integers(1, 400, 3000).astype(np.uint64), np.arange(3000, dtype=np.int64)
    cuts = np.sort(rng.choice(np.arange(1, 3000), 40, replace=False))
    memory = filled(zip(np.split(keys, cuts), np.split(times, cuts)))
    assert len(memory._runs) <= 12  # merged as a binary counter: a few runs, a few searches a lookup
    newest = {int(k): int(t) for k, t in zip(keys, times)}  # the later time of a key wins
    asked = np.array([*newest, 10**6], np.uint64)
    assert memory.impression_times(asked).tolist() == [*newest.values(), NOT_FOUND]
    whole = filled([(keys, times)])
    assert all(np.array_equal(a, b) for a, b in zip(memory.entries(since=1000), whole.entries(since=1000)))


def test_old_times_go_with_their_run_or_at_a_merge():
    memory = filled([([1, 2, 3, 4], [10, 20, 30, 40]), ([5], [50])])
    memory.forget_before(45)  # the run of 1 to 4 (newest 40) goes whole
    assert memory.impression_times(np.array([1, 5], np.uint64)).tolist() == [NOT_FOUND, 50]
    memory.add(np.array([9], np.uint64), np.array([30], np.int64))  # a stale one ...
    memory.add(np.array([10, 11], np.uint64), np.array([80, 90], np.int64))  # ... left out when its run merges
    assert memory.entries(since=0)[1].tolist() == [50, 80, 90] and memory.nbytes == 16 * len(memory)
