"""Serving: `picasso serve` following a stream's champion, against `mlflow models serve`.

Every server here is a real process on loopback, reading one `mlflow server` (SQLite store),
as a deployment would. The models are Wide&Deep on the Criteo spec (39 fields), trained on
planted events. Four parts, each a table:

1. Freshness at the endpoint. Events go to a Kafka topic at --rate per second while
   `picasso stream` (its StreamRunner) trains and publishes a version every --interval-s
   seconds, and `picasso serve --poll-s --poll-s` follows the champion. A client sends
   1-row requests without pause and notes, for each answer, when it came and which version
   gave it (the X-Picasso-Model-Version header). Freshness is taken at every answer: the
   answer's time less the time of the newest event the version that gave it trained on
   (the message's timestamp, stamped when it was sent), so a version served long after
   the next was published counts for every answer it gave. The goal: p50 <= interval + 2
   s, p99 <= interval + 4 s. The answers of the version served when the client started
   are left out (it was loaded at start-up, not followed). Versions published, followed
   (answered at least once), skipped (champions never answered: the alias moved on
   between two polls) and not promoted (the publish policy kept the champion), and the
   real gap between two publishes, are reported beside it, and the two
   parts of the delay: the stream's (its newest event to the publish) and picasso
   serve's (the publish to the version's first answer).
2. Swap cost. Versions one stream interval apart (--rate x --interval-s events each) are
   published first; then a client sends 100-row requests without pause through phases of
   --phase-s seconds, in turns: steady (the alias stays) and swapping (the alias moves to
   the next version every --interval-s seconds, as a stream's publishes would move it).
   swap_p99_over_steady is the swapping phases' p99 over the steady ones' (LOWER is
   better: the one ratio here that is not higher-is-better); the goal is at most 1.5, with
   no failed request.
3. Delta against full. Each swap of part 2 loads by delta (what the server's /version says
   of it: bytes read, seconds); each of those versions is then loaded in full by the same
   loader, in this process, for the same figures. delta_bytes_saving is full bytes over
   delta bytes (the goal: at least 3).
4. Throughput against `mlflow models serve` (one worker, --env-manager local: the
   fastest setting for a CPU model, which scoring threads would only contend on) on the
   same version, 1, 100 and 10,000 rows a request as dataframe_split JSON, the two servers
   taken in turns request by request after a warm-up, both checked to give the same
   answers. vs_mlflow_serve@ROWS is mlflow's p50 over picasso serve's (the goal: at least
   1.0 at every size).
5. Clients. The same two servers, 1-row requests, from three kinds of client: one
   connection kept alive (http.client, as requests.Session and every pool and load
   balancer keep theirs), a new connection per request, and 8 kept-alive clients at once
   (threads, each its own connection). keepalive_vs_fresh_p50 is picasso serve's
   kept-alive p50 over its new-connection p50: a metric, LOWER is better (goal <= 1.2; a
   server without TCP_NODELAY on its accepted sockets answers a kept-alive client only
   after the client's delayed ACK, ~40 ms). vs_mlflow_serve_keepalive is mlflow's
   kept-alive p50 over picasso's, and vs_mlflow_serve_concurrent picasso's answers per
   second over mlflow's with 8 clients at once (goal >= 1.0); both higher is better.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from benchmarks.freshness import produce_at_rate, read_versions
from benchmarks.harness import parse_args, print_table, report, sized
from benchmarks.kafka_bench import kafka_broker
from benchmarks.publish import Cycles
from picasso.builtin_specs import criteo_spec
from picasso.connectors.decoding.message_formats import encode_json
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.serving.publishing.contract import MLflowTarget, PublishRequest
from picasso.serving.publishing.policy import PublishPolicy
from picasso.serving.publishing.publication import publish
from picasso.connectors.testing.mlflow_server import MlflowServer, picasso_served, served_model
from picasso.pipelines.runs.stream import StreamConfig, StreamRunner
from picasso.serving.versions import VersionLoader
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig

ROW_COUNTS = (1, 100, 10_000)
PARTS = ("freshness", "swaps", "throughput", "clients")
CONCURRENT_CLIENTS = 8
SERVERS = ("mlflow", "picasso")
REQUEST_STREAM = 1_000  # a planted stream no model here trained on
VERSION_HEADER = "X-Picasso-Model-Version"


@dataclass(frozen=True)
class Answer:
    sent: float  # time.time() when the request went out
    seconds: float
    status: int
    version: str | None


def request_rows(rows: int) -> pd.DataFrame:
    spec = criteo_spec()
    table, _ = PlantedModel(spec).sample(rows, stream=REQUEST_STREAM)
    return table.drop_columns([spec.label]).to_pandas()


def encode(frame: pd.DataFrame) -> bytes:
    return ('{"dataframe_split": ' + frame.to_json(orient="split", index=False) + "}").encode()


def post(url: str, body: bytes) -> tuple[int, str | None, bytes]:
    call = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(call, timeout=300) as response:
            return response.status, response.headers.get(VERSION_HEADER), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get(VERSION_HEADER), err.read()


def predictions(payload: bytes) -> np.ndarray:
    return np.asarray(json.loads(payload)["predictions"], dtype=np.float64)


def timed_post(url: str, body: bytes) -> Answer:
    sent, started = time.time(), time.perf_counter()
    status, version, _ = post(url, body)
    return Answer(sent, time.perf_counter() - started, status, version)


class ClientLoop:
    """Requests without pause from a thread, each answer kept with its phase label."""

    def __init__(self, url: str, body: bytes):
        self.url, self.body, self.phase = url, body, ""
        self.answers: list[tuple[str, Answer]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.answers.append((self.phase, timed_post(self.url, self.body)))

    def __enter__(self) -> "ClientLoop":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def wait_until(condition: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)
    return found


def served_facts(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/version", timeout=60) as response:
        return json.loads(response.read())


def served_health(url: str) -> dict:
    """/health's report, whether it answers 200 or 503."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read())


# -- 4 and 5. throughput and clients against mlflow models serve --------------------------


@contextlib.contextmanager
def both_servers(uri: str, work: Path, train_events: int) -> Iterator[dict[str, str]]:
    """One published version, served by `mlflow models serve` and by `picasso serve`: their URLs."""
    target = MLflowTarget(uri, experiment="serving-bench", model_name=f"throughput-{uuid.uuid4().hex[:6]}")
    cycles = Cycles("criteo", train_events)
    checkpoint = cycles.train_cycle(work / "throughput")
    ref = publish(PublishRequest(str(checkpoint), {"auc": 0.7, "logloss": 0.6, "calibration": 1.0,
                                                   "samples": cycles.trainer.samples}), target)
    with served_model(ref.model_uri, uri, work / "mlflow-serve.log") as (theirs, _), \
            picasso_served(ref.model_uri, uri, work / "picasso-serve.log") as (ours, _):
        yield {"mlflow": theirs, "picasso": ours}


def throughput(urls: dict[str, str], row_counts, repeat: int) -> tuple[list, dict, dict]:
    rows, ratios, metrics = [], {}, {}
    for count in row_counts:
        body = encode(request_rows(count))
        answers = {name: post(url, body) for name, url in urls.items()}
        assert all(status == 200 for status, _, _ in answers.values()), answers
        np.testing.assert_array_equal(predictions(answers["mlflow"][2]), predictions(answers["picasso"][2]))
        requests = max(5, repeat) if count >= 10_000 else max(20, 20 * repeat)
        times = {name: [] for name in SERVERS}
        for _ in range(2):  # warm-up, both
            for url in urls.values():
                post(url, body)
        for _ in range(requests):
            for name in SERVERS:  # in turns: drift in the machine's load falls on both alike
                times[name].append(timed_post(urls[name], body).seconds)
        p50 = {}
        for name in SERVERS:
            p50[name], p99 = percentile(times[name], 50), percentile(times[name], 99)
            metrics[f"{name}_p50_s@{count}"], metrics[f"{name}_p99_s@{count}"] = p50[name], p99
            rows.append([f"{count:,}", f"{name} serve", 1000 * p50[name], 1000 * p99, requests])
        ratios[f"vs_mlflow_serve@{count}"] = p50["mlflow"] / p50["picasso"]
    return rows, ratios, metrics


class KeptAlive:
    """One HTTP/1.1 connection, kept open from request to request (http.client: what a
    requests.Session or any pool holds)."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlparse(url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)

    def post(self, body: bytes) -> tuple[int, bytes]:
        self.connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
        answer = self.connection.getresponse()
        return answer.status, answer.read()

    def close(self) -> None:
        self.connection.close()


def fresh_post(url: str, body: bytes) -> tuple[int, bytes]:
    """A request on a connection of its own, closed after the answer."""
    once = KeptAlive(url)
    try:
        once.connection.request("POST", "/invocations", body=body,
                                headers={"Content-Type": "application/json", "Connection": "close"})
        answer = once.connection.getresponse()
        return answer.status, answer.read()
    finally:
        once.close()


def _timed(send: Callable[[], tuple[int, bytes]]) -> tuple[float, int]:
    started = time.perf_counter()
    status, _ = send()
    return time.perf_counter() - started, status


def concurrent_rate(url: str, body: bytes, clients: int, requests_each: int) -> tuple[float, list[float], int]:
    """Answers per second with `clients` kept-alive clients sending without pause, each
    request's seconds, and how many answers were not 200."""
    seconds, failed, lock = [], [0], threading.Lock()
    ready = threading.Barrier(clients + 1)

    def client() -> None:
        mine = KeptAlive(url)
        mine.post(body)  # connected and warm before the clock starts
        ready.wait()
        timed = [_timed(lambda: mine.post(body)) for _ in range(requests_each)]
        mine.close()
        with lock:
            seconds.extend(took for took, _ in timed)
            failed[0] += sum(1 for _, status in timed if status != 200)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return clients * requests_each / (time.perf_counter() - started), seconds, failed[0]


def clients(urls: dict[str, str], repeat: int) -> tuple[list, dict, dict]:
    """Part 5: a kept-alive client, a new connection per request, and 8 clients at once,
    1-row requests, the two servers in turns."""
    body = encode(request_rows(1))
    kept = {name: KeptAlive(url) for name, url in urls.items()}
    answers = {name: kept[name].post(body) for name in SERVERS}
    assert all(status == 200 for status, _ in answers.values()), answers
    np.testing.assert_array_equal(predictions(answers["mlflow"][1]), predictions(answers["picasso"][1]))
    requests = max(40, 40 * repeat)
    times = {(name, kind): [] for name in SERVERS for kind in ("kept alive", "new connection")}
    failed = 0
    sends = {(name, kind): send for name in SERVERS for kind, send in (
        ("kept alive", lambda name=name: kept[name].post(body)),
        ("new connection", lambda name=name: fresh_post(urls[name], body)))}
    for turn in range(requests):
        # In turns, one order then its reverse: none always follows the same one (a request
        # right after one to the same server finds its caches warm).
        for key in (list(sends) if turn % 2 == 0 else list(reversed(sends))):
            seconds, status = _timed(sends[key])
            failed += status != 200
            times[key].append(seconds)
    for connection in kept.values():
        connection.close()
    rows, metrics = [], {}
    for (name, kind), seconds in times.items():
        p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
        key = "keepalive" if kind == "kept alive" else "fresh"
        metrics[f"{name}_{key}_p50_s"], metrics[f"{name}_{key}_p99_s"] = p50, p99
        rows.append([f"{name} serve", kind, 1000 * p50, 1000 * p99, len(seconds)])
    rates, latencies = {name: [] for name in SERVERS}, {name: [] for name in SERVERS}
    each = max(25, 25 * repeat)
    for _ in range(3):  # rounds, in turns
        for name in SERVERS:
            rate, seconds, bad = concurrent_rate(urls[name], body, CONCURRENT_CLIENTS, each)
            rates[name].append(rate)
            latencies[name].extend(seconds)
            failed += bad
    for name in SERVERS:
        rate, p50, p99 = float(np.median(rates[name])), percentile(latencies[name], 50), percentile(latencies[name], 99)
        metrics[f"{name}_concurrent_answers_per_s"] = rate
        metrics[f"{name}_concurrent_p50_s"], metrics[f"{name}_concurrent_p99_s"] = p50, p99
        rows.append([f"{name} serve", f"{CONCURRENT_CLIENTS} kept-alive clients at once: {rate:,.0f} answers/s",
                     1000 * p50, 1000 * p99, len(latencies[name])])
    # Lower is better, so a metric, not a ratio (ratios here are higher-is-better).
    metrics["keepalive_vs_fresh_p50"] = metrics["picasso_keepalive_p50_s"] / metrics["picasso_fresh_p50_s"]
    metrics["mlflow_keepalive_vs_fresh_p50"] = metrics["mlflow_keepalive_p50_s"] / metrics["mlflow_fresh_p50_s"]
    metrics["clients_failed_requests"] = failed
    ratios = {"vs_mlflow_serve_keepalive": metrics["mlflow_keepalive_p50_s"] / metrics["picasso_keepalive_p50_s"],
              "vs_mlflow_serve_fresh": metrics["mlflow_fresh_p50_s"] / metrics["picasso_fresh_p50_s"],
              "vs_mlflow_serve_concurrent": metrics["picasso_concurrent_answers_per_s"]
              / metrics["mlflow_concurrent_answers_per_s"]}
    return rows, ratios, metrics


# -- 2 and 3. swap cost, delta against full -----------------------------------------------


def swap_cost(uri: str, work: Path, events_per_version: int, interval_s: float, phase_s: float, phases: int,
              poll_s: float) -> tuple[list, list, dict, dict]:
    swaps_per_phase = max(1, int(phase_s / interval_s))
    target = MLflowTarget(uri, experiment="serving-bench", model_name=f"swaps-{uuid.uuid4().hex[:6]}")
    cycles = Cycles("criteo", events_per_version)
    manual = PublishPolicy(auto_promote=False)  # the alias moves here, on the clock, not at publish
    refs = []
    for _ in range(1 + phases * swaps_per_phase):
        checkpoint = cycles.train_cycle(work / "swaps")
        refs.append(publish(PublishRequest(str(checkpoint), {"auc": 0.7, "logloss": 0.6, "calibration": 1.0,
                                                             "samples": cycles.trainer.samples}),
                            target, manual, workspace=work / "swaps-publish"))
    client = MlflowClient(uri, uri)
    client.set_registered_model_alias(target.model_name, "champion", refs[0].version)
    body = encode(request_rows(100))
    with picasso_served(f"models:/{target.model_name}@champion", uri, work / "swap-serve.log", "--poll-s",
                        str(poll_s)) as (url, _), ClientLoop(url, body) as loop:
        upcoming = iter(refs[1:])
        for phase in range(2 * phases):
            loop.phase = "swapping" if phase % 2 else "steady"
            phase_end = time.monotonic() + phase_s
            if loop.phase == "steady":
                time.sleep(phase_s)
                continue
            for _ in range(swaps_per_phase):
                # Only the alias moves: the client's load is the same as in the steady phases.
                moved = time.monotonic()
                client.set_registered_model_alias(target.model_name, "champion", next(upcoming).version)
                time.sleep(max(0.0, moved + interval_s - time.monotonic()))
            time.sleep(max(0.0, phase_end - time.monotonic()))
        last = refs[-1].version
        wait_until(lambda: served_facts(url)["version"] == last, 120, f"version {last} served")
        loads = [swap for swap in served_health(url)["recent_swaps"] if swap["version"] != refs[0].version]
    answers = loop.answers
    by_phase = {name: [a.seconds for phase, a in answers if phase == name and a.status == 200]
                for name in ("steady", "swapping")}
    failed = sum(1 for _, a in answers if a.status != 200)
    rows = [[name, len(times), 1000 * percentile(times, 50), 1000 * percentile(times, 99)]
            for name, times in by_phase.items()]
    steady_p99, swapping_p99 = percentile(by_phase["steady"], 99), percentile(by_phase["swapping"], 99)

    # 3: each version the server loaded by delta, loaded again in full here. (A version the
    # server's poll skipped, the alias having moved on, makes the next one load in full.)
    loader = VersionLoader(client, work / "full-loads")
    load_rows, delta_bytes, full_bytes, delta_s, full_s = [], [], [], [], []
    for facts in loads:
        full = loader.load_version(target.model_name, client.get_model_version(target.model_name, facts["version"]),
                                   None)
        loader.forget(full)
        load_rows.append([facts["version"], facts["loaded_by"], facts["bytes_read"] / 1e6, full.bytes_read / 1e6,
                          facts["load_s"], full.load_s])
        if facts["loaded_by"] == "delta":
            delta_bytes.append(facts["bytes_read"])
            full_bytes.append(full.bytes_read)
            delta_s.append(facts["load_s"])
            full_s.append(full.load_s)
    assert delta_bytes, f"no swap loaded by delta: {[facts['loaded_by'] for facts in loads]}"
    ratios = {"swap_p99_over_steady": swapping_p99 / steady_p99,
              "delta_bytes_saving": float(np.median(full_bytes)) / float(np.median(delta_bytes))}
    metrics = {"steady_p99_s": steady_p99, "swapping_p99_s": swapping_p99, "swap_failed_requests": failed,
               "swaps": len(loads), "swaps_by_delta": len(delta_bytes), "events_per_version": events_per_version,
               "delta_bytes_median": float(np.median(delta_bytes)), "full_bytes_median": float(np.median(full_bytes)),
               "delta_swap_s_median": float(np.median(delta_s)), "full_swap_s_median": float(np.median(full_s))}
    return rows, load_rows, ratios, metrics


# -- 1. freshness at the endpoint ---------------------------------------------------------


def endpoint_freshness(uri: str, work: Path, bootstrap: str | None, rate: float, seconds: float, interval_s: float,
                       poll_s: float) -> tuple[list, dict, dict]:
    spec = criteo_spec()
    table, _ = PlantedModel(spec).sample(int(rate * seconds), stream=7)
    values = encode_json(table)
    target = MLflowTarget(uri, experiment="serving-bench", model_name=f"fresh-{uuid.uuid4().hex[:6]}")
    with kafka_broker(bootstrap) as servers:
        connection = KafkaConnection(servers)
        topic = f"serving-fresh-{uuid.uuid4().hex[:6]}"
        ensure_topic(connection, topic, 1)
        config = StreamConfig(connection=connection, topics={topic: "json"}, workdir=str(work / "stream"), spec=spec,
                              mlflow=target, train=TrainConfig(device="cpu"), publish_every_s=interval_s,
                              idle_sleep_s=0.2, max_seconds=seconds)
        stop = threading.Event()
        producer = threading.Thread(target=produce_at_rate, args=(connection, topic, values, rate, stop))
        stream = threading.Thread(target=lambda: StreamRunner(config).run())
        producer.start()
        stream.start()
        client = MlflowClient(uri, uri)
        wait_until(lambda: _has_champion(client, target.model_name), 300, "a first version")
        with picasso_served(f"models:/{target.model_name}@champion", uri, work / "fresh-serve.log", "--poll-s",
                            str(poll_s)) as (url, _), ClientLoop(url, encode(request_rows(1))) as loop:
            stream.join()
            time.sleep(interval_s + 2 * poll_s + 2)  # the last version's swap
        stop.set()
        producer.join()
    answers = [a for _, a in loop.answers if a.status == 200]
    published = read_versions(config)
    newest = {str(entry["version"]): entry["newest_event_ms"] / 1000 for entry in published
              if entry.get("newest_event_ms")}
    at_start = answers[0].version if answers else None
    followed = [a for a in answers if a.version != at_start]
    # At every answer: how old the newest event behind the version that gave it was.
    ages = [a.sent + a.seconds - newest[a.version] for a in followed if a.version in newest]
    by_version: dict[str, list[float]] = {}
    for answer, age in zip((a for a in followed if a.version in newest), ages):
        by_version.setdefault(answer.version, []).append(age)
    first_answer: dict[str, float] = {}
    for answer in followed:
        first_answer.setdefault(answer.version, answer.sent + answer.seconds)
    rows, after_publish = [], []
    for entry in published:
        version = str(entry["version"])
        if version in by_version:
            seen = by_version[version]
            # picasso serve's own share: from the publish to the version's first answer.
            after_publish.append(first_answer[version] - entry["published_ms"] / 1000)
            rows.append([version, (entry["published_ms"] / 1000 - newest[version]), after_publish[-1], len(seen),
                         min(seen), percentile(seen, 50), max(seen)])
    after_start = [entry for entry in published if at_start is None or int(entry["version"]) > int(at_start)]
    gaps = np.diff([entry["published_ms"] / 1000 for entry in published])
    failed = sum(1 for _, a in loop.answers if a.status != 200)
    metrics = {"endpoint_freshness_p50_s": percentile(ages, 50), "endpoint_freshness_p99_s": percentile(ages, 99),
               "freshness_answers": len(ages), "publish_interval_s": interval_s,
               "first_answer_after_publish_p50_s": percentile(after_publish, 50),
               "published_after_newest_event_p50_s": percentile(
                   [entry["published_ms"] / 1000 - newest[str(entry["version"])] for entry in published
                    if str(entry["version"]) in by_version], 50),
               "publish_gap_median_s": float(np.median(gaps)) if len(gaps) else float("nan"),
               "publish_gap_max_s": float(np.max(gaps)) if len(gaps) else float("nan"),
               "poll_s": poll_s, "versions_published": len(published), "versions_followed": len(by_version),
               # A champion never answered: the alias moved on between two polls.
               "versions_skipped": sum(1 for entry in after_start if entry.get("champion", True)
                                       and str(entry["version"]) not in by_version),
               "versions_not_promoted": sum(1 for entry in after_start if not entry.get("champion", True)),
               "freshness_failed_requests": failed, "rate_events_per_s": rate}
    ratios = {"freshness_p50_goal_over_measured": (interval_s + 2) / metrics["endpoint_freshness_p50_s"],
              "freshness_p99_goal_over_measured": (interval_s + 4) / metrics["endpoint_freshness_p99_s"]}
    return rows, ratios, metrics


def _has_champion(client: MlflowClient, name: str) -> bool:
    try:
        return client.get_model_version_by_alias(name, "champion") is not None
    except Exception:  # noqa: BLE001 - no model or alias yet
        return False


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--train-events", type=int, default=10_000, help="events the throughput model trains on"),
        p.add_argument("--interval-s", type=float, default=2.0, help="seconds between two versions"),
        p.add_argument("--poll-s", type=float, default=1.0, help="picasso serve's --poll-s"),
        p.add_argument("--rate", type=float, default=2000.0, help="events per second, into the stream"),
        p.add_argument("--seconds", type=float, default=40.0, help="how long the stream of part 1 runs"),
        p.add_argument("--phase-s", type=float, default=10.0, help="length of a steady or swapping phase"),
        p.add_argument("--phases", type=int, default=3, help="steady and swapping phases, each"),
        p.add_argument("--bootstrap", default=None, help="a Kafka to use (default: a Tansu broker started here)"),
        p.add_argument("--parts", default=",".join(PARTS), help=f"which parts to run (default: all of {','.join(PARTS)})")),
        smoke={"train_events": 2048, "repeat": 1, "seconds": 8.0, "rate": 500.0, "phase_s": 2.0, "phases": 1})
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        raise SystemExit(f"--parts: unknown {sorted(parts - set(PARTS))}; choose among {','.join(PARTS)}")
    ratios, metrics, speed_rows = {}, {"failed_requests": 0}, []
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        with MlflowServer(work / "registry") as uri:
            if "freshness" in parts:
                rows, part_ratios, part_metrics = endpoint_freshness(
                    uri, work, args.bootstrap, args.rate, args.seconds, args.interval_s, args.poll_s)
                print_table("serving: freshness at the endpoint, at every answer",
                            ["version", "published after newest event (s)", "first answer after publish (s)",
                             "answers",
                             "freshness min (s)", "p50 (s)", "max (s)"], rows,
                            caption=f"a version every {args.interval_s:g} s, --poll-s {args.poll_s:g}: goal p50 <= "
                                    f"{args.interval_s + 2:g} s, p99 <= {args.interval_s + 4:g} s, over every answer; "
                                    f"{part_metrics['versions_published']} versions published, "
                                    f"{part_metrics['versions_followed']} followed, "
                                    f"{part_metrics['versions_skipped']} skipped, "
                                    f"{part_metrics['versions_not_promoted']} not promoted; publish gap median "
                                    f"{part_metrics['publish_gap_median_s']:.2f} s, max "
                                    f"{part_metrics['publish_gap_max_s']:.2f} s")
                ratios.update(part_ratios)
                metrics.update(part_metrics)
                metrics["failed_requests"] += part_metrics["freshness_failed_requests"]
            if "swaps" in parts:
                rows, load_rows, part_ratios, part_metrics = swap_cost(
                    uri, work, int(args.rate * args.interval_s), args.interval_s, args.phase_s, args.phases,
                    args.poll_s)
                print_table("serving: swap cost, 100 rows a request", ["phase", "requests", "p50 ms", "p99 ms"], rows,
                            caption=f"a swap every {args.interval_s:g} s in the swapping phases; goal p99 ratio "
                                    "<= 1.5 (swap_p99_over_steady: lower is better)")
                print_table("serving: delta swap against a full reload", ["version", "served by", "delta MB",
                                                                           "full MB", "delta s", "full s"], load_rows)
                ratios.update(part_ratios)
                metrics.update(part_metrics)
                metrics["failed_requests"] += part_metrics["swap_failed_requests"]
            if parts & {"throughput", "clients"}:
                with both_servers(uri, work, args.train_events) as urls:
                    if "throughput" in parts:
                        speed_rows, part_ratios, part_metrics = throughput(
                            urls, sized(args, ROW_COUNTS, ROW_COUNTS[:2]), args.repeat)
                        ratios.update(part_ratios)
                        metrics.update(part_metrics)
                    if "clients" in parts:
                        client_rows, part_ratios, part_metrics = clients(urls, args.repeat)
                        print_table("serving: 1-row requests by kind of client", ["server", "client", "p50 ms",
                                                                                   "p99 ms", "requests"], client_rows,
                                    caption="keepalive_vs_fresh_p50 = picasso kept-alive p50 / new-connection p50 "
                                            "(a metric: lower is better, goal <= 1.2); vs_mlflow_serve_concurrent = "
                                            "picasso answers/s / mlflow's, 8 clients at once (goal >= 1.0)")
                        ratios.update(part_ratios)
                        metrics.update(part_metrics)
                        metrics["failed_requests"] += part_metrics["clients_failed_requests"]
    report("serving", ["rows", "server", "p50 ms", "p99 ms", "requests"], speed_rows, ratios, metrics, args.json,
           caption="throughput on one version, in turns; vs_mlflow_serve@ROWS = mlflow p50 / picasso p50")


if __name__ == "__main__":
    main()
