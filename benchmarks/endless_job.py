"""The endless job beside the cycle stream: `python -m benchmarks.freshness --endless`.

Both run as a user runs them, `picasso stream` processes on the same machine, one after
the other, each on a topic of its own that the same producer fills the same way:

1. freshness: events at --rate a second for --seconds; each job publishes a version every
   --publish-every seconds. A version's age is its publish time less the send time of the
   newest event it trained (the job's version log). Goal: the endless job's p50 at most the
   cycle stream's, and at most 2 s beyond the publish interval.
2. throughput at saturation: --backlog events already in the topic when each job starts;
   events trained per second from the process's start to a checkpoint holding all of them
   (start-up included for both: it is what a scheduler pays).
3. exactly-once: the endless job SIGKILLed twice at random moments while events arrive,
   and resubmitted each time; then, from a consumer of the benchmark's own, every good
   message counted against the final checkpoint's ledger: lost (a good message outside
   the ranges applied) and doubled (samples trained beyond the good messages applied).
4. memory: the endless job at --rate for --endless-minutes (10 in the README's figure);
   its resident memory sampled every few seconds; growth from minute 2 to the end.

The cycle stream runs with its defaults (each cycle reads up to the end offsets), the
endless job with its own (a server in its process, a checkpoint every 30 s): both with the
same batch of --batch-messages events, the same model and optimizer settings.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import report, rss_bytes
from benchmarks.kafka_bench import kafka_broker
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint, load_checkpoint, read_applied
from picasso.connectors.decoding.message_formats import encode_json
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.synthetic.planted import PlantedModel

KILLS = 2
BAD_EVERY = 50  # one bad message in every BAD_EVERY, for the exactly-once run


class Producer(threading.Thread):
    """Sends values at `rate` a second (0: as fast as it can) until stopped or out of values;
    keeps each message's offset once the broker acknowledged it."""

    def __init__(self, connection: KafkaConnection, topic: str, values: list[bytes], rate: float):
        super().__init__(daemon=True)
        self.connection, self.topic, self.values, self.rate = connection, topic, values, rate
        self.stop = threading.Event()
        self.offsets: list[int] = []

    def run(self):
        producer = self.connection.producer(linger_ms=5, batch_size=512 * 1024)
        started, futures = time.perf_counter(), []
        for i, value in enumerate(self.values):
            if self.stop.is_set():
                break
            ahead = started + i / self.rate - time.perf_counter() if self.rate else 0
            if ahead > 0:
                time.sleep(ahead)
            futures.append(producer.send(self.topic, value=value))
        producer.flush()
        self.offsets = [future.get(timeout=60).offset for future in futures]
        producer.close()


def _command(workdir: Path, bootstrap: str, topic: str, args, *extra: str) -> list[str]:
    return [sys.executable, "-m", "picasso.pipelines.cli", "stream", "--spec", "criteo", "--topic", topic,
            "--workdir", str(workdir), "--bootstrap-servers", bootstrap, "--device", "cpu", "--cache-capacity", "off",
            "--batch-messages", str(args.batch_messages), "--dead-letter-topic", f"{topic}.dead",
            "--group-id", f"{topic}.group", *extra]


def start_job(command: list[str], log: Path) -> subprocess.Popen:
    """A job's process, its output appended to `log` (benchmarks.cli starts its endless job so too)."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def _positions(workdir: Path) -> dict[str, int]:
    path = latest_checkpoint(workdir / "checkpoints")
    return load_checkpoint(path).positions if path else {}


def wait_trained(process: subprocess.Popen, workdir: Path, topic: str, end: int, timeout: float = 1800) -> float:
    """Until the newest checkpoint holds every one of `end` messages; the time it did."""
    deadline = time.monotonic() + timeout
    while _positions(workdir).get(f"{topic}/0", 0) < end:
        ended = process.poll() is not None
        if (ended and _positions(workdir).get(f"{topic}/0", 0) < end) or time.monotonic() > deadline:
            raise RuntimeError(f"{workdir.name}: the job ended or hung before training {end} messages")
        time.sleep(0.25)
    return time.perf_counter()


def stop_job(process: subprocess.Popen) -> None:
    """SIGTERM, as a scheduler stops a job, and a kill only if it outlasts 5 minutes."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()


def _ages(workdir: Path) -> np.ndarray:
    path = workdir / "runs" / "stream-versions.jsonl"
    versions = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return np.array([(v["published_ms"] - v["newest_event_ms"]) / 1000 for v in versions if v.get("newest_event_ms")])


def freshness(kind: str, root: Path, bootstrap: str, values: list[bytes], args) -> np.ndarray:
    """Events at args.rate for args.seconds into a topic of the job's own; the ages of the
    versions it published meanwhile."""
    connection, topic = KafkaConnection(bootstrap), f"fresh-{kind}-{int(time.time())}"
    ensure_topic(connection, topic, 1)
    workdir = root / f"fresh-{kind}"
    flags = ("--endless",) if kind == "endless" else ()
    process = start_job(_command(workdir, bootstrap, topic, args, "--publish-every", str(args.publish_every), *flags),
                     root / f"fresh-{kind}.log")
    time.sleep(args.startup_s)  # start-up (imports, the kernels) is not what a version's age measures
    producer = Producer(connection, topic, values[:int(args.rate * args.seconds)], args.rate)
    producer.start()
    producer.join()
    wait_trained(process, workdir, topic, len(producer.offsets))
    stop_job(process)
    return _ages(workdir)


def throughput(kind: str, root: Path, bootstrap: str, values: list[bytes], args) -> float:
    """Events trained a second from a backlog of args.backlog events, start-up included."""
    connection, topic = KafkaConnection(bootstrap), f"backlog-{kind}-{int(time.time())}"
    ensure_topic(connection, topic, 1)
    backlog = Producer(connection, topic, values[:args.backlog], 0)
    backlog.run()
    workdir = root / f"backlog-{kind}"
    flags = ("--endless", "--checkpoint-every-s", "1") if kind == "endless" else ("--until-caught-up",)
    started = time.perf_counter()
    process = start_job(_command(workdir, bootstrap, topic, args, "--publish-every", "0", *flags),
                     root / f"backlog-{kind}.log")
    done = wait_trained(process, workdir, topic, args.backlog)
    if kind == "endless":
        stop_job(process)
    process.wait(timeout=300)
    return args.backlog / (done - started)


def exactly_once(root: Path, bootstrap: str, values: list[bytes], args) -> dict:
    """Two SIGKILLs at random moments while events arrive, a resubmit after each; then lost
    and doubled good messages against the final checkpoint, counted from the producer's side."""
    rng = random.Random(args.seed)
    connection, topic = KafkaConnection(bootstrap), f"once-{int(time.time())}"
    ensure_topic(connection, topic, 1)
    bad = set(range(BAD_EVERY - 1, len(values), BAD_EVERY))
    sent = [b"{not json" if i in bad else value for i, value in enumerate(values[:int(args.rate * args.seconds)])]
    workdir = root / "once"
    command = _command(workdir, bootstrap, topic, args, "--endless", "--publish-every", str(args.publish_every),
                       "--checkpoint-every-s", "2")
    producer = Producer(connection, topic, sent, args.rate)
    producer.start()
    kills = [round(rng.uniform(3.0, args.seconds / (KILLS + 1)), 1) for _ in range(KILLS)]
    for wait in kills:
        process = start_job(command, root / "once.log")
        time.sleep(wait)
        process.kill()
        process.wait()
    process = start_job(command, root / "once.log")
    producer.join()
    wait_trained(process, workdir, topic, len(producer.offsets))
    stop_job(process)
    final = latest_checkpoint(workdir / "checkpoints")
    applied = read_applied(final).get(f"{topic}/0", [])
    good = [offset for i, offset in enumerate(producer.offsets) if i not in bad]
    covered = sum(1 for offset in good if any(a <= offset < b for a, b in applied))
    samples = int(load_checkpoint(final).state["samples"])
    return {"kills_after_s": kills, "good_messages": len(good), "lost": len(good) - covered,
            "doubled": max(0, samples - covered), "samples_trained": samples}


def memory(root: Path, bootstrap: str, values: list[bytes], args) -> dict:
    """The endless job at args.rate for args.endless_minutes; its RSS from minute 2 on."""
    connection, topic = KafkaConnection(bootstrap), f"memory-{int(time.time())}"
    ensure_topic(connection, topic, 1)
    seconds = args.endless_minutes * 60
    workdir = root / "memory"
    process = start_job(_command(workdir, bootstrap, topic, args, "--endless", "--publish-every",
                              str(args.publish_every)), root / "memory.log")
    count = int(args.rate * seconds)
    producer = Producer(connection, topic, [values[i % len(values)] for i in range(count)], args.rate)
    producer.start()
    started, samples = time.monotonic(), []
    while producer.is_alive():
        samples.append((time.monotonic() - started, rss_bytes(process.pid)))
        time.sleep(5)
    stop_job(process)
    after_two = [rss for t, rss in samples if t >= 120] or [samples[-1][1]]
    return {"minutes": args.endless_minutes, "rss_at_minute_2_mb": after_two[0] / 2**20,
            "rss_at_end_mb": after_two[-1] / 2**20, "rss_peak_mb": max(r for _, r in samples) / 2**20,
            "growth": after_two[-1] / after_two[0] - 1, "events": count}


def endless_versus_cycle(args) -> None:
    spec = criteo_spec()
    count = max(int(args.rate * args.seconds), args.backlog)
    values = encode_json(PlantedModel(spec).sample(count, stream=7)[0])
    with kafka_broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ages = {kind: freshness(kind, root, bootstrap, values, args) for kind in ("cycle", "endless")}
        rates = {kind: throughput(kind, root, bootstrap, values, args) for kind in ("cycle", "endless")}
        once = exactly_once(root, bootstrap, values, args)
        held = memory(root, bootstrap, values, args)
    p = {kind: (float(np.percentile(a, 50)), float(np.percentile(a, 99))) for kind, a in ages.items()}
    interval = args.publish_every
    rows = [["freshness p50 (s)", p["cycle"][0], p["endless"][0], f"endless <= cycle, <= {interval + 2:g}"],
            ["freshness p99 (s)", p["cycle"][1], p["endless"][1], ""],
            ["versions", len(ages["cycle"]), len(ages["endless"]), ""],
            ["events/s at saturation (start-up in)", rates["cycle"], rates["endless"], "endless >= cycle"],
            ["lost / doubled after 2 kills", "-", f"{once['lost']} / {once['doubled']}", "0 / 0"],
            [f"RSS growth, minute 2 to {args.endless_minutes:g}", "-", f"{held['growth']:+.1%}", "< 10%"]]
    ratios = {"endless_vs_cycle_freshness_p50": p["cycle"][0] / p["endless"][0],
              "endless_vs_cycle_throughput": rates["endless"] / rates["cycle"]}
    metrics = {"endless_freshness_p50_s": p["endless"][0], "endless_freshness_p99_s": p["endless"][1],
               "cycle_freshness_p50_s": p["cycle"][0], "cycle_freshness_p99_s": p["cycle"][1],
               "endless_p50_beyond_interval_s": p["endless"][0] - interval,
               "endless_events_per_s": rates["endless"], "cycle_events_per_s": rates["cycle"],
               "endless_lost": once["lost"], "endless_doubled": once["doubled"],
               "endless_memory_growth": held["growth"], "exactly_once": once, "memory": held,
               "publish_every_s": interval, "rate_events_per_s": args.rate, "backlog_events": args.backlog,
               "batch_messages": args.batch_messages}
    report("endless job against the cycle stream", ["", "cycle stream", "endless job", "goal"], rows, ratios,
           metrics, args.json,
           caption=f"{args.rate:g} events/s for {args.seconds:g} s, a version every {interval:g} s; a backlog of "
                   f"{args.backlog:,}; memory over {args.endless_minutes:g} min at {args.rate:g}/s")
