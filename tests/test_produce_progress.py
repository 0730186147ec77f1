"""`picasso produce` says how far it is while it sends: a plain line per --progress-every
seconds of producing (events sent/total, events/s, time left) and a last one at the end,
also when stderr is a file."""

from __future__ import annotations

import io
import re
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import CLI_PROCESS
from rich.console import Console
from stream_helpers import json_messages

from picasso.pipelines.cli.produce_progress import ProduceProgress
from picasso.pipelines.cli.progress import Progress
from picasso.pipelines.runs.produce import count_records

LINE = re.compile(r"^producing into (\S+): ([\d,]+)/([\d,]+) events · ([\d,]+) events/s · (\S+) left$")
LAST = re.compile(r"^producing into (\S+): ([\d,]+)/([\d,]+) events in [\d.]+s · ([\d,]+) events/s$")


def test_a_line_per_period_of_producing_and_one_at_the_end():
    now = [0.0]
    out = io.StringIO()
    with Progress(Console(file=out, width=200), "producing into t") as progress:
        lines = ProduceProgress(progress, "producing into t", total=260, period_s=10, clock=lambda: now[0])
        for _ in range(26):  # 10 events a second for 26 s
            now[0] += 1
            lines(10)
        lines.finish()
    printed = out.getvalue().splitlines()
    assert printed == ["producing into t: 100/260 events · 10 events/s · 16s left",
                       "producing into t: 200/260 events · 10 events/s · 6s left",
                       "producing into t: 260/260 events in 26.0s · 10 events/s"]


def test_the_total_counts_every_record_as_produce_sends_it(tmp_path):
    day = tmp_path / "date=2026-11-01"
    day.mkdir()
    (day / "part-00000.jsonl").write_bytes(b"\n".join(json_messages(7)))  # no newline after the last line
    (day / "part-00001.tsv").write_bytes(b"1\t2\n3\t4\n")
    pq.write_table(pa.table({"x": list(range(11))}), day / "part-00002.parquet")
    assert count_records(str(tmp_path), ["2026-11-01"]) == 7 + 2 + 11


def test_produce_prints_its_progress_lines_into_a_log_file(tmp_path, kafka_bootstrap, kafka_topic):
    day = tmp_path / "data" / "date=2026-11-01"
    day.mkdir(parents=True)
    (day / "part-00000.jsonl").write_bytes(b"\n".join(json_messages(30)) + b"\n")
    log = tmp_path / "produce.log"
    with open(log, "wb") as out:  # stderr redirected, as under a scheduler
        done = subprocess.run([*CLI_PROCESS, "produce", "--data", str(tmp_path / "data"), "--date", "2026-11-01",
                               "--topic", kafka_topic, "--bootstrap-servers", kafka_bootstrap,
                               "--max-records", "20", "--progress-every", "1e-9"],
                              stdout=out, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("producing into")]
    # A period shorter than a send: a line after each message, then the last one.
    assert [LINE.match(line).group(2, 3) for line in lines[:-1]] == [(str(n), "20") for n in range(1, 21)]
    assert LAST.match(lines[-1]).group(2, 3) == ("20", "20")
    assert "\x1b[" not in text  # no live display's escape codes in a file
