"""Why a stream cycle failed, and what the stream does about it.

A failed cycle leaves no trace (see pipelines.stream), so the only question is whether
to try again:
- OUTSIDE: the world around the stream (a broker gone, a timeout, a refused dead-letter
  write). It passes, so the cycle is retried with backoff, for ever unless
  --max-failures says otherwise. Nothing of the data is touched: good events are never
  made dead letters because the broker was away.
- FATAL: the stream cannot read on as configured (a codec with no library here). A
  retry meets the same bytes, so the stream stops with the error, which says what to do.
  Errors say so with a class attribute `retryable = False`. A dead letter the topic did
  not take (not written, or too large) is FATAL where the dead-letter policy says STOP
  (connectors/dead_letters/policy.py).
- REPEATED: anything else is retried too, but when it fails the same way at the same
  positions REPEATS_BEFORE_STOPPING times in a row it is taken to come from the data or
  from a bug, which no retry mends: the stream stops with the error rather than spin on
  the same offsets for ever. (Data that the decoders cannot cope with never gets here:
  connectors.decoding.message_formats turns each such message into a dead letter.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kafka.errors import KafkaError

from picasso.connectors.dead_letters.policy import STOP, DeadLetterPolicy
from picasso.connectors.dead_letters.topic import DeadLettersNotWritten, DeadLetterTooLarge
from picasso.connectors.kafka_codecs import CodecUnavailable
from picasso.connectors.kafka_config import TopicNotFound
from picasso.connectors.kafka_source import SourceStalled
from picasso.connectors.kafka_wait import broker_retry_line, error_line, seconds, unreachable_reason

OUTSIDE, FATAL, REPEATED = "outside", "fatal", "repeated"
REPEATS_BEFORE_STOPPING = 3
# OSError: connections, timeouts, and a disk that is full or gone for a while.
# TopicNotFound: in a running stream a broker that has just restarted may not know a topic
# yet; one missing when the stream starts is refused before its first cycle
# (pipelines/cli/stream.topics_ready: exit 2, or --wait-for-topic).
_OUTSIDE_ERRORS = (KafkaError, SourceStalled, TopicNotFound, DeadLettersNotWritten, OSError)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """The error and its causes (Beam re-raises a DoFn's error, sometimes wrapped)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def classify(err: BaseException, dead_letters: DeadLetterPolicy = DeadLetterPolicy()) -> str:
    """OUTSIDE or FATAL, or REPEATED for errors whose cause is not known. An error of the
    dead-letter topic is FATAL where the stream's dead-letter policy stops on it."""
    errors = list(_chain(err))
    # CodecUnavailable.raised_in also knows the form a multi-worker runner hands it back
    # in: a RuntimeError carrying the worker's traceback as text.
    if any(getattr(e, "retryable", True) is False or CodecUnavailable.raised_in(e) for e in errors):
        return FATAL
    if _stopped_by(dead_letters, errors):
        return FATAL
    if any(isinstance(e, _OUTSIDE_ERRORS) for e in errors):
        return OUTSIDE
    return REPEATED


def _stopped_by(dead_letters: DeadLetterPolicy, errors: list[BaseException]) -> bool:
    """Whether the dead-letter policy stops the stream on one of these errors of its topic."""
    return any((isinstance(e, DeadLettersNotWritten) and dead_letters.not_written == STOP)
               or (isinstance(e, DeadLetterTooLarge) and dead_letters.too_large == STOP) for e in errors)


def retry_line(err: BaseException, bootstrap_servers: str, delay_s: float) -> str:
    """What a stream says of a cycle it retries. An outside failure while no broker takes
    connections reads as at start (connectors.kafka_wait): 'no Kafka broker at HOST:PORT
    (connection refused); retrying in 2 s'; anything else names the error."""
    if classify(err) == OUTSIDE:
        reason = unreachable_reason(bootstrap_servers, timeout_s=2.0)
        if reason is not None:
            return broker_retry_line(bootstrap_servers, reason, delay_s)
    return f"cycle failed ({error_line(err)}); retrying in {seconds(delay_s)} s"


class StreamStopped(RuntimeError):
    """The stream gave up: a fatal error, or one that repeats at the same positions."""


@dataclass
class FailureTracker:
    """Counts how often the same error has failed a cycle at the same start positions."""

    signature: tuple | None = None
    repeats: int = 0
    dead_letters: DeadLetterPolicy = DeadLetterPolicy()  # the stream's: it says which letter failures stop it

    def classify(self, err: BaseException) -> str:
        return classify(err, self.dead_letters)

    def record(self, err: BaseException, positions: dict[str, int]) -> StreamStopped | None:
        """The error that stops the stream, or None when the cycle is to be retried."""
        kind = self.classify(err)
        message = f"{type(err).__name__}: {str(err).splitlines()[0][:500] if str(err) else ''}"
        if kind == FATAL:
            why = "the dead-letter policy stops on it" if _stopped_by(self.dead_letters, list(_chain(err))) \
                else "retrying cannot succeed"
            return StreamStopped(f"stopped: {message} ({why})")
        if kind == OUTSIDE:
            self.signature, self.repeats = None, 0
            return None
        signature = (type(err).__name__, _first_line(err), tuple(sorted(positions.items())))
        self.repeats = self.repeats + 1 if signature == self.signature else 1
        self.signature = signature
        if self.repeats >= REPEATS_BEFORE_STOPPING:
            where = ", ".join(f"{source} at {position}" for source, position in sorted(positions.items())) or "the start"
            return StreamStopped(f"stopped: the cycle from {where} failed {self.repeats} times in a row "
                                 f"the same way: {message}")
        return None

    def reset(self) -> None:
        self.signature, self.repeats = None, 0


def _first_line(err: BaseException) -> str:
    # Beam appends where it ran ("[while running 'Train']"), which is the same every time.
    return str(err).splitlines()[0] if str(err) else ""
