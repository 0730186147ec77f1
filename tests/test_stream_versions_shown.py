"""`picasso stream` shows the versions it made: a version published as the stream stopped
(after its last cycle line) gets a line of its own, and the summary table a versions row.
Its cycle lines are whole lines in a log file."""

from __future__ import annotations

import json
import re

from stream_helpers import fill_topic, json_messages, start_process, stream_command, write_spec


def test_a_version_published_as_the_stream_stops_is_shown(kafka_bootstrap, kafka_topic, tmp_path):
    fill_topic(kafka_bootstrap, kafka_topic, json_messages(60, stream=11), partitions=1)
    log = tmp_path / "stream.log"
    # No version is due while it runs (one an hour): the only one is made on the way out,
    # to the work folder's own MLflow store.
    process = start_process(stream_command(write_spec(tmp_path), kafka_bootstrap, f"{kafka_topic}:json",
                                           tmp_path / "work", "--until-caught-up", "--publish-every", "3600",
                                           "--dead-letter-topic", f"{kafka_topic}.dead", "--json"), log)
    try:
        assert process.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert json.loads(text.strip().splitlines()[-1])["versions"] == ["1"]
    assert "version 1 published after the last cycle" in text
    # Each cycle is one whole line in the file, not wrapped at a terminal's width.
    cycles = [line for line in text.splitlines() if re.match(r"cycle \d+: ", line)]
    assert cycles and all(line.endswith("version -") for line in cycles), text[-3000:]
    assert re.search(r"│\s*versions\s*│\s*1\s*│", text), text[-3000:]
