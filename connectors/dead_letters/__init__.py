"""Dead letters: bad input, where it came from, why it was refused, and where it goes.

- letters.py: the letters: DeadLetter (a record of a day file) and MessageDeadLetter (a
  Kafka message, its bytes as they arrived), and reason_kind, by which they are counted;
- policy.py: DeadLetterPolicy, what happens to each kind of bad input (start here to
  change it);
- files.py: WriteDeadLettersToFiles, a daily run's letters as JSON lines;
- topic.py: the dead-letter topic: DeadLetterProducer, the WriteDeadLettersToKafka
  transform, and the errors that fail a bundle whose letters were not written;
- oversize.py: how a letter too large for Kafka is measured and cut down.
"""
