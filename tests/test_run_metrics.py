"""--metrics-port: Prometheus metrics of a stream, a parameter server and produce, scraped
over HTTP and checked against what the runs themselves report, and against a separate
Kafka consumer for the lag."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaConnectionError
from mlflow.tracking import MlflowClient
from prometheus_client.parser import text_string_to_metric_families
from stream_helpers import (SPEC, fill_topic, json_messages, produce_values, start_process, stream_command, wait_for,
                            write_spec)

from picasso import storage
from picasso.connectors.dead_letters.letters import reason_kind
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.kafka_codecs import CodecUnavailable
from picasso.connectors.kafka_config import KafkaConnection
from picasso.serving.publishing.contract import MLflowTarget
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import ServerAddress
from picasso.distributed.ps_checkpoint import build_shard
from picasso.distributed.ps_client import PSClient
from picasso.models import build_model
from picasso.pipelines.runs.cycle_failures import FailureTracker
from picasso.pipelines.runs.produce import ProduceConfig, produce
from picasso.pipelines.runs.endless_server import EndlessServer, EndlessServerConfig
from picasso.pipelines.runs.run_metrics import (EndlessJobMetrics, EndlessServerMetrics, MetricsAddress,
                                                MetricsEndpoint, ProduceMetrics, ShardMetrics, StreamMetrics)
from picasso.pipelines.runs.stream import StreamConfig, StreamRunner
from picasso.pipelines.runs.stream_window import ScoredWindow
from picasso.pipelines.runs.workdir import Workdir
from picasso.pipelines.transforms.process_counts import ProcessCounts
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches
from test_trainer import CONFIG
from test_trainer import SPEC as TRAINER_SPEC

NOW_S = 2_000_000_000.0  # the metrics' clock in the stream test: freshness is then exact


def scrape(url: str) -> dict[tuple, float]:
    """Every sample of a /metrics page: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def labelled(samples: dict[tuple, float], name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (sample, labels), value in samples.items() if sample == name}


def end_offsets_by_a_separate_consumer(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """Each partition's end, as a consumer of the test's own reads it, not through picasso's
    lookup. Tansu's end_offsets() can under-report (FACTS.md): the high watermark a fetch
    returns is right, so the larger of the two is the end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(0, ends[tp] - 1))
        deadline = time.monotonic() + 60
        while any(consumer.highwater(tp) is None for tp in tps):
            assert time.monotonic() < deadline, "no fetch answered within 60 s"
            consumer.poll(timeout_ms=500)
        return {f"{topic}/{tp.partition}": max(ends[tp], consumer.highwater(tp)) for tp in tps}
    finally:
        consumer.close()


def lag_by_a_separate_consumer(bootstrap: str, group: str, topic: str, partitions: int) -> dict[str, int]:
    """End offset minus the group's committed offset per partition, as a consumer of its
    own reads them."""
    ends = end_offsets_by_a_separate_consumer(bootstrap, topic, partitions)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {source: end - (consumer.committed(TopicPartition(topic, int(source.rsplit("/", 1)[1]))) or 0)
                for source, end in ends.items()}
    finally:
        consumer.close()


def scrape_until(command, log, condition, what: str, stop: bool = True) -> dict[tuple, float]:
    """Start command(metrics_port) (a long-running picasso command writing to `log`), scrape
    its /metrics until condition(samples) holds, then stop it as an operator would (SIGTERM;
    stop False: let it end by itself): it must exit 0. The last scrape."""
    port = free_port()
    process = start_process(command(port), log)
    samples = {}

    def holds() -> bool:
        nonlocal samples
        try:
            samples = scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:  # not serving yet
            return False
        return condition(samples)

    try:
        wait_for(holds, process, what)
        if stop:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
    return samples


def test_reason_kinds_are_the_first_words_of_a_reason():
    assert reason_kind("field 'c1': null id") == "field"
    assert reason_kind("invalid JSON: Expecting value: line 1") == "invalid_json"
    assert reason_kind("row 3: missing label 'y'") == "missing_label"  # an Arrow message's letter
    assert reason_kind("orphan label: no impression with uid=7 arrived") == "orphan_label"
    assert reason_kind("invalid Arrow IPC stream: 12 bytes after its end") == "invalid_arrow_ipc_stream"
    assert reason_kind("unknown field 'x-17'") == reason_kind("unknown field 'y'") == "unknown_field"
    assert reason_kind("") == reason_kind("17 ids") == "other"


def test_a_metrics_address_is_a_port_or_host_and_port():
    assert MetricsAddress.parse("9400") == MetricsAddress(9400, "0.0.0.0")
    assert MetricsAddress.parse("127.0.0.1:9400") == MetricsAddress(9400, "127.0.0.1")
    for bad in ("", "host:", "x:port", "70000"):
        with pytest.raises(ValueError, match="--metrics-port"):
            MetricsAddress.parse(bad)


# -- a stream, scraped after each of its cycles --------------------------------------------------


@pytest.fixture(scope="module")
def scraped_stream(kafka_bootstrap, mlflow_server, tmp_path_factory):
    """A stream in capped cycles over two partitions (bad messages mixed in), publishing;
    after each cycle (in its on_cycle callback, so nothing moves meanwhile) its /metrics
    is scraped over HTTP and the lag read by a separate consumer."""
    topic = f"metrics-events-{time.time_ns()}"
    good = json_messages(600)
    values = good[:250] + [b"{broken", json.dumps({"d1": 1.0}).encode(), b"{also broken"] + good[250:]
    fill_topic(kafka_bootstrap, topic, values, partitions=2)
    config = StreamConfig(
        connection=KafkaConnection(kafka_bootstrap), topics={topic: "json"},
        workdir=str(tmp_path_factory.mktemp("metrics-stream")), spec=SPEC,
        mlflow=MLflowTarget(mlflow_server, experiment="metrics-test", model_name="metrics-test-model"),
        train=TrainConfig(hidden=(16, 8), device="cpu"), dead_letters=DeadLetterPolicy(topic="metrics-test.dead"), batch_messages=50,
        max_cycle_messages=100, publish_every_s=0.5, until_caught_up=True, group_id=f"metrics-group-{topic}")
    runner = StreamRunner(config)
    seen = []
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        StreamMetrics(endpoint.registry, clock=lambda: NOW_S).watch(runner)
        reported = runner.on_cycle

        def after_cycle(report, summary):
            reported(report, summary)  # the metrics take the report first
            seen.append((report, _copy(summary), scrape(endpoint.url),
                         lag_by_a_separate_consumer(kafka_bootstrap, config.group_id, topic, 2)))

        runner.on_cycle = after_cycle
        summary = runner.run()
        final = scrape(endpoint.url)
    return config, summary, seen, final, topic


def _copy(summary):
    return json.loads(json.dumps(summary.__dict__))


def test_a_streams_lag_is_the_end_offsets_minus_the_positions_a_separate_consumer_reads(scraped_stream):
    _, summary, seen, _, topic = scraped_stream
    assert len(seen) == summary.cycles >= 3  # capped: several cycles, the lag shrinking
    lags = []
    for report, _, samples, by_consumer in seen:
        lag = labelled(samples, "picasso_consumer_lag_messages", "partition")
        assert {f"{topic}/{p}": v for p, v in lag.items()} == by_consumer == report.partition_lag
        lags.append(sum(lag.values()))
    assert lags[0] > 0 and lags[-1] == 0 and lags == sorted(lags, reverse=True)


def test_a_streams_counters_are_its_summarys(scraped_stream):
    _, summary, seen, final, _ = scraped_stream
    events = 0
    for report, at_cycle, samples, _ in seen:
        events += report.events
        assert samples[("picasso_stream_cycles_total", ())] == at_cycle["cycles"]
        assert samples[("picasso_messages_read_total", ())] == at_cycle["messages"]
        assert samples[("picasso_samples_trained_total", ())] == at_cycle["samples"]
        assert samples[("picasso_events_read_total", ())] == events == at_cycle["samples"] + at_cycle["dead_letters"]
        letters = labelled(samples, "picasso_dead_letters_total", "reason")
        assert sum(letters.values()) == at_cycle["dead_letters"]
        failures = labelled(samples, "picasso_stream_cycle_failures_total", "kind")
        assert failures == {"outside": 0, "fatal": 0, "repeated": 0}
    assert labelled(final, "picasso_dead_letters_total", "reason") == {"invalid_json": 2, "missing_label": 1}
    assert final[("picasso_messages_read_total", ())] == summary.messages == 603
    assert final[("picasso_stream_cycles_total", ())] == summary.cycles


def test_a_streams_version_freshness_and_progressive_metrics(scraped_stream):
    config, summary, seen, final, _ = scraped_stream
    client = MlflowClient(config.mlflow.tracking_uri)
    published_in_a_cycle = 0
    before = []
    for _, at_cycle, samples, _ in seen:
        if at_cycle["versions"]:
            assert samples[("picasso_model_version", ())] == float(at_cycle["versions"][-1])
        else:
            assert ("picasso_model_version", ()) not in samples
        auc, logloss = samples[("picasso_progressive_auc", ())], samples[("picasso_progressive_logloss", ())]
        assert 0 <= auc <= 1 and logloss > 0 and samples[("picasso_progressive_window_samples", ())] > 0
        if at_cycle["versions"] != before:  # a version took the window at this cycle: the scrape says its metrics
            version = client.get_model_version(config.mlflow.model_name, at_cycle["versions"][-1])
            logged = client.get_run(version.run_id).data.metrics
            assert (auc, logloss) == pytest.approx((logged["auc"], logged["logloss"]))
            assert samples[("picasso_progressive_window_samples", ())] == logged["window_samples"]
            published_in_a_cycle += 1
        before = at_cycle["versions"]
    assert published_in_a_cycle >= 1
    log = [json.loads(line) for line in open(f"{config.workdir}/runs/stream-versions.jsonl")]
    newest = log[-1]
    assert final[("picasso_model_version", ())] == float(newest["version"]) == float(summary.versions[-1])
    assert final[("picasso_model_version_published_timestamp_seconds", ())] == newest["published_ms"] / 1000
    event_s = final[("picasso_model_version_newest_event_timestamp_seconds", ())]
    assert event_s == newest["newest_event_ms"] / 1000
    assert final[("picasso_model_version_freshness_seconds", ())] == pytest.approx(NOW_S - event_s)


def test_failed_cycles_are_counted_by_kind(tmp_path):
    """classify's kinds: the broker gone is outside, a codec that cannot be had is fatal,
    anything else repeated."""
    config = StreamConfig(connection=KafkaConnection("127.0.0.1:1"), topics={"t": "json"}, workdir=str(tmp_path),
                          spec=SPEC, mlflow=None)
    runner = StreamRunner(config)
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        StreamMetrics(endpoint.registry).watch(runner)
        tracker = FailureTracker()
        for err in (KafkaConnectionError("gone"), KafkaConnectionError("gone"), ValueError("a bug"),
                    CodecUnavailable.at("t/0 at offset 5", "snappy")):
            runner._gives_up(err, {"t/0": 5}, tracker, 1)
        failures = labelled(scrape(endpoint.url), "picasso_stream_cycle_failures_total", "kind")
    assert failures == {"outside": 2, "repeated": 1, "fatal": 1} and runner.summary.failures == 4


def test_picasso_stream_serves_its_metrics_while_it_runs(kafka_bootstrap, kafka_topic, tmp_path):
    """The command line: `picasso stream --metrics-port`, scraped while it waits for more
    events, then stopped; its summary says what the last scrape said."""
    fill_topic(kafka_bootstrap, kafka_topic, json_messages(300), partitions=2)
    log = tmp_path / "stream.log"

    def caught_up(samples) -> bool:
        lag = labelled(samples, "picasso_consumer_lag_messages", "partition")
        return samples.get(("picasso_messages_read_total", ()), 0) == 300 and lag == {"0": 0, "1": 0}

    samples = scrape_until(lambda port: stream_command(
        write_spec(tmp_path), kafka_bootstrap, kafka_topic, tmp_path / "work", "--publish-every", "0",
        "--batch-messages", "100", "--idle-sleep", "0.2", "--metrics-port", f"127.0.0.1:{port}", "--json"),
        log, caught_up, "a scrape of the caught-up stream")
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert samples[("picasso_stream_cycles_total", ())] == summary["cycles"] >= 1
    assert samples[("picasso_samples_trained_total", ())] == summary["samples"] == 300


# -- the parameter server ------------------------------------------------------------------------


def _contribution(client: PSClient, computer: GradientComputer, batch, worker: str, start: int) -> Contribution:
    tensors = batch.to_torch()
    rows = computer.rows_needed(tensors)
    pulled = client.pull(rows)
    gradient = computer.compute(tensors, pulled.dense, rows, pulled.values)
    sparse = {key: RowGradient(rows, gradient.row_grads[key], pulled.versions[key])
              for key, rows in gradient.rows.items()}
    end = start + batch.num_samples
    return Contribution(worker, pulled.tokens[0], gradient.samples, gradient.dense, sparse, {"src": end},
                        ranges={"src": (start, end)})


def test_a_parameter_servers_live_workers_duplicates_and_staleness():
    """Two workers pull at step 0; the first push steps (plain async), so the second is one
    step stale; the first pushed again is acknowledged as a duplicate."""
    trainer = Trainer(TRAINER_SPEC, CONFIG)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig.plain_async())
    computer = GradientComputer(build_model(CONFIG.model, TRAINER_SPEC, trainer.plan, CONFIG.hidden))
    batches, _ = planted_batches(TRAINER_SPEC, 128, 64)
    clients = [PSClient(layout, f"worker{i}/a", max_in_flight=0, call=in_process([shard])) for i in range(2)]
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        ShardMetrics(endpoint.registry, shard)
        assert scrape(endpoint.url)[("picasso_ps_live_workers", ())] == 0
        first, second = [_contribution(c, computer, b, f"worker{i}/a", 64 * i)  # both pull at step 0
                         for i, (c, b) in enumerate(zip(clients, batches))]
        assert shard.push(first).stepped and shard.push(second).staleness == 1
        assert shard.push(first).duplicate
        samples = scrape(endpoint.url)
    pushes = labelled(samples, "picasso_ps_pushes_total", "outcome")
    assert samples[("picasso_ps_live_workers", ())] == 2
    assert pushes["accepted"] == 2 and pushes["duplicate"] == 1 and pushes["dropped_stale"] == 0
    assert pushes == {k: v for k, v in shard.counts().items() if k not in ("accepted_samples", "steps")}
    assert samples[("picasso_ps_push_staleness_steps_count", ())] == 2
    assert samples[("picasso_ps_push_staleness_steps_sum", ())] == 1
    assert samples[("picasso_ps_global_step", ())] == 2 and samples[("picasso_ps_samples_trained_total", ())] == 128


@pytest.mark.parametrize("job", [("--workers", "1"), ("--endless", "--publish-every", "0")], ids=["job", "endless"])
def test_picasso_ps_serves_its_metrics(job, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TRAINER_SPEC.to_yaml())
    port, metrics = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "picasso.pipelines.cli.distributed", "ps", "--spec", str(spec),
                               "--workdir", str(tmp_path), "--port", str(port), *job, "--hidden", "16,8",
                               "--timeout", "600", "--metrics-port", f"127.0.0.1:{metrics}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = {}

    def serving() -> bool:
        nonlocal samples
        try:
            samples = scrape(f"http://127.0.0.1:{metrics}/metrics")
            return True
        except OSError:
            return False

    try:
        wait_for(serving, server, "the server's metrics")
    finally:
        server.terminate()
        server.wait(timeout=300)  # a hang guard: a busy machine may still be loading the kernels
    assert samples[("picasso_ps_live_workers", ())] == 0 and samples[("picasso_ps_global_step", ())] == 0


def test_an_endless_servers_metrics_are_its_shards_its_window_and_its_versions(tmp_path):
    """The endless job's server (not serving: its state is what is scraped): the shard's
    metrics, the progressive metrics of its newest checkpoint's window, and the newest
    version of its version log, read again when the server makes one."""
    server = EndlessServer(EndlessServerConfig(TRAINER_SPEC, CONFIG, str(tmp_path), {"events": "json"}),
                           ServerAddress("127.0.0.1", free_port()))
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        EndlessServerMetrics(endpoint.registry, server, clock=lambda: NOW_S)
        before = scrape(endpoint.url)
        window = ScoredWindow()
        window.add(np.array([0, 1, 1, 0, 1], np.float32), np.array([0.2, 0.9, 0.6, 0.3, 0.4], np.float32))
        server.model.window = window  # a checkpoint's
        log = Workdir(str(tmp_path)).stream_versions
        storage.append_line(log, json.dumps({"version": "7", "published_ms": 1_999_999_000_000,
                                             "newest_event_ms": 1_999_999_990_500}))
        server.versions.append("7")
        after = scrape(endpoint.url)
    assert before[("picasso_ps_live_workers", ())] == 0 and before[("picasso_ps_global_step", ())] == 0
    assert ("picasso_progressive_auc", ()) not in before and ("picasso_model_version", ()) not in before
    assert after[("picasso_progressive_auc", ())] == pytest.approx(window.metrics()["auc"])
    assert after[("picasso_progressive_window_samples", ())] == 5
    assert after[("picasso_model_version", ())] == 7
    assert after[("picasso_model_version_freshness_seconds", ())] == pytest.approx(9.5)


def test_an_endless_jobs_lag_is_the_end_offsets_minus_its_servers_positions(kafka_bootstrap):
    """The endless job's process: the lag is the partitions' ends minus the server's
    positions, both as of the latest lookup, a partition the server has no position for
    counting from its beginning; what its workers decoded is the tally since the metrics
    started."""
    topic = f"metrics-endless-{time.time_ns()}"
    fill_topic(kafka_bootstrap, topic, json_messages(300), partitions=2)
    ends = end_offsets_by_a_separate_consumer(kafka_bootstrap, topic, 2)
    positions: dict[str, int] = {f"{topic}/0": 40}
    counts = ProcessCounts()
    counts.add("messages_in", 5)  # before the job's metrics started: not theirs
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        metrics = EndlessJobMetrics(endpoint.registry, KafkaConnection(kafka_bootstrap), [topic],
                                    lambda: dict(positions), lookup_every_s=None, counts=counts)
        metrics.refresh()
        first = scrape(endpoint.url)
        positions.update({f"{topic}/0": ends[f"{topic}/0"], f"{topic}/1": 100})
        for name, n in (("messages_in", 30), ("rows_in", 31), ("dead_letters", 2), ("dead_letters.invalid_json", 2)):
            counts.add(name, n)
        second = scrape(endpoint.url)  # the lag as of the first lookup
        produce_values(kafka_bootstrap, topic, json_messages(20, stream=1), 2)  # 10 more in each partition
        metrics.refresh()
        third = scrape(endpoint.url)
    lag = lambda samples: {f"{topic}/{p}": v for p, v in  # noqa: E731
                           labelled(samples, "picasso_consumer_lag_messages", "partition").items()}
    assert lag(first) == lag(second) == {f"{topic}/0": ends[f"{topic}/0"] - 40, f"{topic}/1": ends[f"{topic}/1"]}
    assert lag(third) == {f"{topic}/0": 10, f"{topic}/1": ends[f"{topic}/1"] + 10 - 100}
    assert first[("picasso_messages_read_total", ())] == 0 and first[("picasso_events_read_total", ())] == 0
    assert second[("picasso_messages_read_total", ())] == 30 and second[("picasso_events_read_total", ())] == 31
    assert labelled(second, "picasso_dead_letters_total", "reason") == {"invalid_json": 2}


def test_an_endless_jobs_lag_goes_while_its_broker_cannot_be_reached_and_scrapes_still_answer():
    """The lookup runs in the metrics' own thread: a scrape answers at once while it waits
    for a broker that is not there, and there is no lag series until one answers."""
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        metrics = EndlessJobMetrics(endpoint.registry, KafkaConnection(f"127.0.0.1:{free_port()}"), ["events"],
                                    dict, lookup_every_s=1.0, counts=ProcessCounts())
        try:
            samples = scrape(endpoint.url)
        finally:
            metrics.close()
    assert labelled(samples, "picasso_consumer_lag_messages", "partition") == {}
    assert samples[("picasso_messages_read_total", ())] == 0


def test_picasso_stream_endless_serves_its_metrics_while_it_runs(kafka_bootstrap, tmp_path):
    """The command line: `picasso stream --endless --metrics-port`, scraped until its server
    has trained every message, then stopped: its server's metrics and its reads' agree with
    the job's summary and with the topic."""
    topic, workdir, log = f"metrics-endless-job-{time.time_ns()}", tmp_path / "work", tmp_path / "endless.log"
    good = json_messages(300)
    fill_topic(kafka_bootstrap, topic, good[:150] + [b"{broken", json.dumps({"d1": 1.0}).encode()] + good[150:],
               partitions=2)
    ends = end_offsets_by_a_separate_consumer(kafka_bootstrap, topic, 2)

    def trained(samples) -> bool:
        return samples.get(("picasso_ps_samples_trained_total", ()), 0) == 300 and \
            labelled(samples, "picasso_consumer_lag_messages", "partition") == {"0": 0, "1": 0}

    samples = scrape_until(lambda port: stream_command(
        write_spec(tmp_path), kafka_bootstrap, topic, workdir, "--endless", "--batch-messages", "50",
        "--publish-every", "0", "--checkpoint-every-s", "1", "--metrics-port", f"127.0.0.1:{port}", "--json"),
        log, trained, "a scrape of the job with every message trained")
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["positions"] == ends and summary["samples"] == 300
    assert samples[("picasso_messages_read_total", ())] == 302 and samples[("picasso_events_read_total", ())] == 302
    assert labelled(samples, "picasso_dead_letters_total", "reason") == {"invalid_json": 1, "missing_label": 1}
    assert samples[("picasso_ps_global_step", ())] == summary["step"] > 0


# -- produce -------------------------------------------------------------------------------------


def test_produce_counts_what_it_sent(kafka_bootstrap, kafka_topic, criteo_day):
    root, date = criteo_day
    config = ProduceConfig(KafkaConnection(kafka_bootstrap), kafka_topic, str(root), (date,), fmt="arrow",
                           rows_per_message=500, max_records=2_300)
    with MetricsEndpoint(MetricsAddress(0, "127.0.0.1")) as endpoint:
        metrics = ProduceMetrics(endpoint.registry)
        progressed = []
        result = produce(config, on_progress=metrics.counted(progressed.append))
        samples = scrape(endpoint.url)
    assert samples[("picasso_produce_records_total", ())] == result.records == sum(progressed) == 2_300
    assert samples[("picasso_produce_messages_total", ())] == result.messages == len(progressed)


def test_picasso_produce_serves_its_metrics_while_it_sends(kafka_bootstrap, kafka_topic, tmp_path):
    """The command line: `picasso produce --metrics-port`, paced by --rate so that it is
    scraped while it sends; what it had sent then is part of what it says it sent."""
    day = tmp_path / "data" / "date=2026-11-01"
    day.mkdir(parents=True)
    (day / "part-00000.jsonl").write_bytes(b"\n".join(json_messages(100)) + b"\n")
    log = tmp_path / "produce.log"
    samples = scrape_until(lambda port: [
        sys.executable, "-m", "picasso.pipelines.cli", "produce", "--data", str(tmp_path / "data"), "--date",
        "2026-11-01", "--topic", kafka_topic, "--bootstrap-servers", kafka_bootstrap, "--rate", "20",
        "--metrics-port", f"127.0.0.1:{port}", "--json"], log,
        lambda samples: samples[("picasso_produce_records_total", ())] > 0, "a scrape of produce sending", stop=False)
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["records"] == 100
    assert 0 < samples[("picasso_produce_records_total", ())] == samples[("picasso_produce_messages_total", ())] < 100
