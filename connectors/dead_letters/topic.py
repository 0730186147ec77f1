"""The dead-letter topic: every refused Kafka message (a MessageDeadLetter, letters.py), as
it arrived, with where and why; written as the policy (policy.py) says.

What is guaranteed:
- Every dead letter of a bundle is acknowledged by the broker (acks=all) before the bundle
  finishes. The sink keeps the future of each send and, at the end of the bundle, flushes
  and waits for every one. If any failed (refused by the broker, or not acknowledged within
  the policy's `delivery_timeout_s`), the bundle raises DeadLettersNotWritten, naming how
  many failed and why the first one did. The stream cycle then fails before it
  checkpoints; by default (the policy's `not_written`) it is retried from the last
  checkpoint, so no dead letter is lost.
- The wait is bounded. Within `delivery_timeout_s` the client retries transient errors
  itself (a leader moving, a broker restarting); past it, a send fails, so a dead broker
  fails the cycle and does not hang it.
- A letter too large to send whole (over the producer's `max_request_size`, or refused by
  the broker as too large) is, by default (the policy's `too_large`), still written, cut
  down to its first bytes with its size and SHA-256 (see oversize.py for the encoding).
  Such a letter never blocks the stream. Only a producer limit too small for even the cut
  letter (a few KiB) fails the bundle, with DeadLetterTooLarge.
- Each letter is written once. Its identity is its message's position, the (topic,
  partition, offset) of its headers: before its first send a producer reads back from the
  topic which letters of what it reads are there already (lettered.py), and skips those,
  so that a job resubmitted after a kill, or a cycle retried after a failure, does not
  letter again what it reads again. It skips the letters it has had acknowledged itself,
  and reads the topic back again after a send that failed, whose letter may be there or
  not. A topic that cannot be read back fails the bundle as a letter not written would
  (LettersUnreadable).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import apache_beam as beam
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

from picasso.connectors.dead_letters import oversize
from picasso.connectors.dead_letters.lettered import Lettered, LetterScope, LettersUnreadable, read_lettered
from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.dead_letters.policy import STOP, DeadLetterPolicy
from picasso.connectors.kafka_config import KafkaConnection, source_name

log = logging.getLogger(__name__)

LINGER_MS = 20
# kafka-python expires a record delivery_timeout after send(); the wait at the end of a
# bundle allows this much more before it gives up on a future itself (a hang guard only).
CONFIRM_GRACE_S = 5.0


class DeadLettersNotWritten(RuntimeError):
    """Some dead letters of a bundle were not acknowledged by the broker, or the topic could
    not be read back to learn which it holds."""


class DeadLetterTooLarge(RuntimeError):
    """A dead letter does not fit the producer's limit even cut down, or the policy says
    not to cut it."""


@dataclass(frozen=True)
class _Send:
    letter: MessageDeadLetter  # as sent: cut already if it did not fit
    future: object  # kafka-python's FutureRecordMetadata


class DeadLetterProducer:
    """Sends dead letters to the topic and confirms them: what the sink's DoFn does per
    bundle, and what a decode that must not let a chunk go on before its letters are
    written does per poll (DecodeMessages with letters_to=).

    scope: what it will letter (each source partition from the offset it is read from), which
    bounds what is read back from the topic; lettered: what the topic is known to hold of
    that scope already (a stream whose last cycle succeeded knows it holds nothing at or
    above the next cycle's starts); None: read it back before the first send."""

    def __init__(self, connection: KafkaConnection, policy: DeadLetterPolicy, scope: LetterScope = LetterScope(),
                 lettered: Lettered | None = None):
        self.connection = connection
        self.policy = policy
        self.scope = scope
        self.lettered = lettered
        self.producer = None
        self.skipped = 0  # letters the topic held already, not sent again
        self.sent = 0  # letters sent, over the producer's life

    def open(self) -> None:
        delivery_timeout_ms = int(self.policy.delivery_timeout_s * 1000)
        self.producer = self.connection.producer(
            acks="all",
            linger_ms=LINGER_MS,
            # retries stay kafka-python's default (unbounded, idempotent): a transient error
            # is retried until the delivery timeout, and then the send fails.
            delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=min(30_000, delivery_timeout_ms - LINGER_MS),
            # send() waits this long at most for metadata or buffer space: a broker that is
            # gone before the first send fails the bundle too.
            max_block_ms=delivery_timeout_ms,
        )
        self.max_request_size = self.producer.config["max_request_size"]
        self.letters = 0
        self.sends: list[_Send] = []

    def send(self, letter: MessageDeadLetter) -> None:
        if self._known().has(letter):
            self.skipped += 1
            return
        self.letters += 1
        self.sent += 1
        too_large = self._over_limit(letter)
        if too_large:
            self._send_cut(letter, too_large)
        else:
            self._send(letter)

    def _known(self) -> Lettered:
        if self.lettered is None:
            try:
                self.lettered = read_lettered(self.connection, self.policy.topic, self.scope)
            except LettersUnreadable as error:
                raise DeadLettersNotWritten(str(error)) from error
        return self.lettered

    def _over_limit(self, letter: MessageDeadLetter) -> str | None:
        """Why the letter is too large for the producer, or None if it fits."""
        size = oversize.letter_size(letter, self.policy.max_reason_bytes)
        return f"{size} bytes > max_request_size {self.max_request_size}" if size > self.max_request_size else None

    def _send(self, letter: MessageDeadLetter):
        try:
            future = self.producer.send(self.policy.topic, key=letter.key, value=letter.value,
                                        headers=letter.headers(self.policy.max_reason_bytes),
                                        timestamp_ms=letter.timestamp_ms or None)
        except MessageSizeTooLargeError as error:  # the client's exact check, should ours be short
            self._send_cut(letter, _describe(error))
            return
        except KafkaError as error:  # e.g. no metadata within max_block_ms: the broker is gone
            raise DeadLettersNotWritten(
                f"dead letter {_named(letter)} could not be sent to '{self.policy.topic}': "
                f"{_describe(error)}") from error
        self.sends.append(_Send(letter, future))

    def _send_cut(self, letter: MessageDeadLetter, why: str):
        """Send the letter cut down, as the policy says by default; one that is cut already
        and still too large is an error, as is any too large letter when the policy stops."""
        if self.policy.too_large == STOP:
            raise DeadLetterTooLarge(
                f"dead letter {_named(letter)} is too large ({why}), and the dead-letter "
                "policy stops rather than cut it")
        cut = letter if letter.is_cut else oversize.cut_letter(letter, why, self.policy.kept_prefix_bytes)
        still_too_large = why if letter.is_cut else self._over_limit(cut)
        if still_too_large:
            raise DeadLetterTooLarge(
                f"dead letter {_named(letter)} does not fit even cut down "
                f"({still_too_large}); raise the producer's max_request_size")
        self._send(cut)

    def confirm(self) -> None:
        """Wait until the broker has acknowledged every letter sent since the last confirm;
        raise DeadLettersNotWritten if any failed."""
        failures: list[tuple[MessageDeadLetter, Exception]] = []
        # A letter the broker refuses as too large is sent again cut down, hence the rounds.
        while self.sends:
            sends, self.sends = self.sends, []
            failed = self._confirm(sends)
            for send, error in failed:
                if isinstance(error, MessageSizeTooLargeError) and not send.letter.is_cut:
                    self._send_cut(send.letter, f"refused by Kafka: {_describe(error)}")
                else:
                    failures.append((send.letter, error))
            unanswered = {id(send) for send, _ in failed}
            self._known().add(send.letter for send in sends if id(send) not in unanswered)
        letters, self.letters = self.letters, 0
        if failures:
            # A send that failed may have reached the topic all the same (an answer lost on
            # its way back): what the topic holds is read back again before the next send.
            self.lettered = None
            letter, error = failures[0]
            raise DeadLettersNotWritten(
                f"{len(failures)} of {letters} dead letters were not written to '{self.policy.topic}'; "
                f"the first, {_named(letter)}: {_describe(error)}")

    def _confirm(self, sends: list[_Send]) -> list[tuple[_Send, Exception]]:
        """The sends that failed, with their errors, once every one has an answer."""
        deadline = time.monotonic() + self.policy.delivery_timeout_s + CONFIRM_GRACE_S
        try:
            self.producer.flush(timeout=self.policy.delivery_timeout_s + CONFIRM_GRACE_S)
        except KafkaTimeoutError:
            pass  # the futures still unanswered say so below, one by one
        failed = []
        for send in sends:
            try:
                send.future.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as error:  # noqa: BLE001 - every failure of a write is reported
                failed.append((send, error))
        return failed

    def close(self) -> None:
        if self.producer is None:
            return
        try:
            self.producer.close(timeout=5)
        except KafkaError as error:
            # close() flushes, which times out with the broker gone: the bundle has failed
            # already, and its error (not this one) says why.
            log.warning("closing the dead-letter producer: %s", _describe(error))


class _WriteDeadLettersDoFn(beam.DoFn):
    def __init__(self, letters: DeadLetterProducer):
        self.letters = letters

    def setup(self):
        self.letters.open()

    def process(self, letter: MessageDeadLetter):
        self.letters.send(letter)

    def finish_bundle(self):
        self.letters.confirm()

    def teardown(self):
        self.letters.close()


def _named(letter: MessageDeadLetter) -> str:
    """e.g. 'events/3 offset 17': where the letter's message was."""
    return f"{source_name(letter.topic, letter.partition)} offset {letter.offset}"


def _describe(error: Exception) -> str:
    text, name = str(error), type(error).__name__
    return text if name in text else f"{name}: {text}"  # kafka-python often names the class itself


class WriteDeadLettersToKafka(beam.PTransform):
    """MessageDeadLetters in; each becomes one record of the policy's dead-letter topic,
    acknowledged by the broker before its bundle finishes, and none that the topic holds
    already (see the module docstring; scope and lettered as DeadLetterProducer's)."""

    def __init__(self, connection: KafkaConnection, policy: DeadLetterPolicy, scope: LetterScope = LetterScope(),
                 lettered: Lettered | None = None):
        super().__init__()
        self.letters = DeadLetterProducer(connection, policy, scope, lettered)

    def expand(self, letters):
        return letters | "Produce" >> beam.ParDo(_WriteDeadLettersDoFn(self.letters))
