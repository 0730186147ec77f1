"""Lines of the libraries under picasso that tell a picasso user nothing, silenced each by
its own text: never a whole logger, nor a whole category of warnings.

- Beam's "apitools not found, and bigquery client libraries are not available", logged on
  the root logger when Beam is imported, so on every command that runs a pipeline or
  touches a URL: it is about BigQuery, which picasso does not use. (Logged through logging.warning, it still sets up
  the root logger's default handler, as it always did: only the line is gone.)
- Beam's "No shards found to finalize", once per partition: WriteToText(skip_if_empty)
  of an empty dead-letter collection writes no file, as asked (connectors/dead_letters/files.py).
- The error Beam logs with its traceback before it raises it again out of a DoFn, when it
  is one the command then says in one line (cli/output.py: bad input): `--debug` keeps it.

The Kafka clients' lines are the exception, kept quiet by their logger (kafka-python's,
and librdkafka's under it): each is about a connection, a dozen a try and several a second
while a broker is away, and picasso says one line a retry in their place. show_debug says
so in every process of the command (connectors/kafka_client_logs.py).

MLflow's "Add type hints to the `predict` method" is answered, not silenced: the served
model's predict says what it takes (serving/pyfunc_model.py).
"""

from __future__ import annotations

import logging
import sys
import traceback

from picasso.connectors.kafka_client_logs import show_client_logs

_debug = False


def silence() -> None:
    """Install the filters (again: no effect). Before Beam is imported: cli/__init__.py."""
    logging.getLogger().addFilter(_no_apitools_notice)
    logging.getLogger("apache_beam.io.filebasedsink").addFilter(_no_shards_to_finalize)
    logging.getLogger("apache_beam.runners.common").addFilter(_error_said_in_one_line)


def show_debug(debug: bool) -> None:
    """--debug: Beam's log of an error comes back, with its traceback, and the Kafka
    clients' warnings and errors."""
    global _debug
    _debug = debug
    show_client_logs(debug)


def print_traceback(err: BaseException) -> None:
    traceback.print_exception(err, file=sys.stderr)


def _no_apitools_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("apitools not found, and bigquery client libraries are not available")


def _no_shards_to_finalize(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("No shards found to finalize")


def _error_said_in_one_line(record: logging.LogRecord) -> bool:
    from picasso.pipelines.cli.output import is_bad_input  # rich and picasso's errors: loaded by then

    err = record.exc_info[1] if record.exc_info else None
    return _debug or err is None or not is_bad_input(err)
