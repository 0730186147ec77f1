"""What happens to each kind of bad input: the one place to read it, and to change it.

Bad input never crashes a run and is never silently dropped (DESIGN.md): every refused
record leaves as a dead letter with its reason, and is counted by its reason's kind
(letters.reason_kind; the `dead_letters.KIND` counters and the picasso_dead_letters
metric). What is left to choose is what happens to a letter on its way out, and that is
DeadLetterPolicy's fields. The kinds, and what happens to each by default:

A Kafka message (`picasso stream`, its cycles and its endless job):
- does not decode (not JSON, not an Arrow IPC stream, no value at all): one letter with
  the message's bytes as they arrived and the reason, to `topic`. Its offset is passed;
  the other messages of the poll train (connectors/decoding/message_formats.py).
- has rows a field refuses: the same one letter for the message. An Arrow message's letter
  names each refused row ("row 3: missing label 'y'") and counts them as its records,
  rather than one copy of a large message per row; its valid rows train.
- makes a decoder raise (a decoder bug that data found): the poll is decoded again one
  message at a time, and that message's letter gives the error as its reason.
- is a label that found no impression (a joined stream's orphan): its event, rebuilt from
  what the join kept, is a letter to `topic` (connectors/join_events.py).
Its letter, on the way to `topic` (topic.py):
- too large for the producer (over kafka-python's `max_request_size`, or refused by the
  broker as too large): `too_large`. CUT: written cut down to its first `kept_prefix_bytes`,
  with the original's size and SHA-256 (oversize.py), so that it never blocks the stream;
  a producer limit too small for even the cut letter fails the cycle, which stops the
  stream once it fails so REPEATS_BEFORE_STOPPING times at the same positions
  (pipelines/runs/cycle_failures.py). STOP: the stream stops with the letter's size.
- refused by the broker, or not acknowledged within `delivery_timeout_s` (the topic or its
  broker down): `not_written`. RETRY: the cycle fails before its checkpoint and is retried
  from it with backoff, as any failure of the world around the stream, for ever unless
  --max-failures says otherwise, so no letter is lost (a retried cycle may write one
  twice: its headers name its message). STOP: the stream stops with the error. (The
  endless job has no cycle to retry: its bundle fails before the poll's rows train, and
  so does the job.)
- its reason is capped at `max_reason_bytes` in the `picasso.reason` header.

A day file (`picasso daily`; files.py, no choices): a record a field refuses is one letter
a record, and a file that cannot be read to its end one letter from its first unread
row, as JSON lines under WORKDIR/dead_letters/date=D/.

How many letters a run may have before it is not published is the run-health gate's
(--max-dead-letter-share, pipelines/runs/run_health.py), not this policy's.

The command line builds the policy (pipelines/cli/dead_letter_args.py) and the runs pass
it down whole (StreamConfig.dead_letters, EndlessConfig.dead_letters).
"""

from __future__ import annotations

from dataclasses import dataclass

# What can happen to a letter the topic cannot take as it is (see the module docstring).
CUT = "cut"  # written cut down to its first bytes, with the original's size and SHA-256
RETRY = "retry"  # the cycle fails and is retried from its checkpoint
STOP = "stop"  # the stream stops with the error

# Two defaults by name, for the tests that check a letter against them.
KEPT_PREFIX_BYTES = 1024
MAX_REASON_BYTES = 4096


@dataclass(frozen=True)
class DeadLetterPolicy:
    """What happens to the letters of bad Kafka messages; the defaults are what every run
    does unless told otherwise (the module docstring says each kind)."""

    topic: str = "picasso.dead-letters"  # where the letters go (one partition: they stay in arrival order)
    too_large: str = CUT  # a letter over the producer's limit: CUT or STOP
    kept_prefix_bytes: int = KEPT_PREFIX_BYTES  # of a cut letter's value (and of a key that long)
    not_written: str = RETRY  # a letter refused, or not acknowledged in time: RETRY or STOP
    delivery_timeout_s: float = 60.0  # the broker's time to acknowledge a letter
    max_reason_bytes: int = MAX_REASON_BYTES  # of the reason header; cut on a character boundary

    def __post_init__(self):
        if self.too_large not in (CUT, STOP):
            raise ValueError(f"too_large must be {CUT!r} or {STOP!r}, got {self.too_large!r}")
        if self.not_written not in (RETRY, STOP):
            raise ValueError(f"not_written must be {RETRY!r} or {STOP!r}, got {self.not_written!r}")
        if self.delivery_timeout_s < 1:
            raise ValueError(f"delivery_timeout_s must be at least 1 second, got {self.delivery_timeout_s}")
        for name in ("kept_prefix_bytes", "max_reason_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
