"""Sample join: throughput, memory, exactness and what late labels cost the model.

The planted model's impression and click streams (picasso.connectors.synthetic.events: Criteo's 39
fields, clicks after an exponential delay with a mean of 5 minutes, 2% of them sent twice)
are joined with W = 15 minutes by picasso's columnar core (picasso.sample_join.join_state) and by two
joins of the same policy, one event at a time over dicts: the dict join a competent user
would write, whose records point at their rows in the calls' Arrow tables and whose samples
are one Arrow take per call (picasso.sample_join.dict_join), and the reference join, which holds
every row as a Python dict and builds its samples from dicts (picasso.sample_join.reference).
All three are fed the very same calls: events in event-time order, cut into calls of
--call-events, each followed by the watermark (the newest event time), every event with its
key's hash and the key itself (join_keys, join_ids: all three compare keys exactly).

- Throughput, on one core: the joins take the same calls until 1M impressions wait for
  their label (15 minutes of traffic at 1,500 impressions a second); then --repeat windows
  of --timed-events events each are timed, the joins in turns (window 1 of each, then
  window 2, ...), each join reading on from where its last window left it. The median
  window is reported, and the spread (fastest less slowest). `vs_dict_join` is the dict
  join's median time over picasso's, `vs_reference_join` the reference join's.
- Memory per pending impression, at 1M pending: for picasso, its state's own count of
  every buffer it holds (JoinState.nbytes: the feature rows, the arrays, the keys' text
  and the key index's C++ table, which tracemalloc does not see), checked against the
  resident memory a fresh process grows by while its join fills (`rss_bytes_per_pending`,
  `nbytes_over_rss`), with tracemalloc's count beside them; for the dict joins, which hold
  Python objects, what tracemalloc counts plus the Arrow tables their records point at;
  against the raw event's size as JSON on the topic.
- Exactness: a whole stream joined to its end, every sample's label (and every correction)
  against an offline join of the stream's truth with the same policy. `label_errors` counts
  the impressions whose samples differ.
- Quality: three models trained on the same impressions, decided while impressions
  arrive: with the true labels in their order of arrival (no delay), with the joined
  samples in their order of emission under `drop`, and under `correct` (with its loss
  weights, picasso.sample_join.delayed_feedback); each scored on the same held-out impressions with
  their true labels. `auc_delta@drop` and `auc_delta@correct` are the
  joined models' AUC less the true-label model's.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import statistics
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa

from benchmarks.harness import parse_args, report, rss_bytes
from picasso.batch import pack
from picasso.builtin_specs import criteo_spec
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.sample_join.delayed_feedback import late_share
from picasso.metrics import auc
from picasso.packing import PackingPlan
from picasso.sample_join.sample_buffer import SampleBuffer
from picasso.sample_join.join_rules import CORRECTION_COLUMN, KEY_COLUMN, Impressions, JoinPolicy, Labels, join_ids, join_keys
from picasso.sample_join.join_state import JoinState
from picasso.sample_join.dict_join import ArrowDictJoin
from picasso.sample_join.reference import DictJoin
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.events import EVENT_TIME, REQUEST_ID, EventStreamConfig, make_event_stream
from picasso.trainer import TrainConfig, Trainer

START_MS = 1_780_000_000_000
WAIT_MS = 15 * 60_000
QUALITY_WAITS = 12  # the quality stream's length, in waits W
LATE_SHARE = "late_share"  # the benchmark's own column: d̂ when the sample was emitted
JOINS = {"picasso": JoinState, "dict join": ArrowDictJoin, "reference join": DictJoin}
# --smoke: a size that runs in seconds, to check the benchmark works (its figures mean nothing).
SMOKE = {"pending": 3_000, "timed_events": 2_000, "call_events": 1_000, "quality_rows": 4_000,
         "quality_call_events": 500, "held_out_rows": 1_000, "batch": 500, "repeat": 2}


def decoded_features(spec, impressions: pa.Table) -> pa.Table:
    """The canonical rows of impression events (what the join holds)."""
    decoder = RecordDecoder(spec, DecodeOptions(require_label=False))
    return decoder.decode_table(impressions.drop([REQUEST_ID, EVENT_TIME]), "impressions").table


def calls_of(spec, stream, call_events: int):
    """The stream as join calls: (Impressions | None, Labels | None, watermark), events in
    event-time order, the watermark the newest event time so far (one partition each)."""
    imp, lab = stream.impressions, stream.labels
    imp_keys, imp_ids = join_keys([imp.column(REQUEST_ID)]), join_ids([imp.column(REQUEST_ID)])
    lab_keys, lab_ids = join_keys([lab.column(REQUEST_ID)]), join_ids([lab.column(REQUEST_ID)])
    imp_times, lab_times = imp.column(EVENT_TIME).to_numpy(), lab.column(EVENT_TIME).to_numpy()
    features = decoded_features(spec, imp)
    values = lab.column(spec.label).to_numpy().astype(np.int8)
    times = np.concatenate([imp_times, lab_times])
    is_label = np.r_[np.zeros(len(imp_times), bool), np.ones(len(lab_times), bool)]
    order = np.argsort(times, kind="stable")
    calls = []
    for start in range(0, len(order), call_events):
        part = order[start:start + call_events]
        i = part[~is_label[part]]
        j = part[is_label[part]] - len(imp_times)
        impressions = (Impressions(imp_keys[i], imp_times[i], features.take(pa.array(i)), ids=imp_ids[i])
                       if len(i) else None)
        labels = Labels(lab_keys[j], lab_times[j], values[j], ids=lab_ids[j]) if len(j) else None
        calls.append((impressions, labels, int(times[part].max())))
    return calls


def with_new_ids(call):
    """The call with its ids made anew, as a host decodes them poll by poll: the strings a
    join keeps are then allocations of its own, which tracemalloc counts."""
    impressions, labels, watermark = call

    def new(ids: np.ndarray) -> np.ndarray:
        return np.array([text.encode().decode() for text in ids.tolist()], dtype=object)
    return (replace(impressions, ids=new(impressions.ids)) if impressions is not None else None,
            replace(labels, ids=new(labels.ids)) if labels is not None else None, watermark)


def raw_event_bytes(stream, sample: int = 20_000) -> float:
    rows = stream.impressions.slice(0, sample).to_pylist()
    return float(np.mean([len(json.dumps(row, separators=(",", ":"))) for row in rows]))


# -- throughput and memory ----------------------------------------------------------------


def _calls(spec, args) -> tuple[list, float]:
    """The calls every join is fed (enough to fill args.pending, then args.repeat timed
    windows of args.timed_events), and the raw impression event's size as JSON."""
    # About a fifth of the impressions are clicked within W and leave at once: for
    # `pending` to wait, W must hold a third more impressions than that.
    rate = 1.35 * args.pending / (WAIT_MS / 1000)
    rows = int(rate * WAIT_MS / 1000 * 1.1) + args.timed_events * args.repeat
    stream = make_event_stream(PlantedModel(spec), rows, stream=1,
                               config=EventStreamConfig(start_ms=START_MS, impressions_per_s=rate))
    return calls_of(spec, stream, args.call_events), raw_event_bytes(stream)


def _fill(join, calls, pending: int) -> int:
    """Feed calls (their ids made anew, as a host decodes them) until `pending` wait; the
    calls taken."""
    filled = 0
    while join.pending < pending:
        join.advance(*with_new_ids(calls[filled]))
        filled += 1
    return filled


def resident_growth(spec, args) -> dict:
    """In a fresh process: picasso's join filled to args.pending, its resident memory's
    growth over the fill (VmRSS after less before, the calls made before) beside its own
    count of every buffer (JoinState.nbytes)."""
    calls, _ = _calls(spec, args)
    gc.collect()
    before = rss_bytes()
    join = JoinState(JoinPolicy(wait_ms=WAIT_MS), calls[0][0].rows.schema)
    _fill(join, calls, args.pending)
    gc.collect()
    return {"rss_growth": rss_bytes() - before, "nbytes": join.nbytes(), "pending": join.pending}


def throughput(spec, args) -> dict:
    """Every join filled to args.pending, then args.repeat timed windows of
    args.timed_events events each, the joins in turns; the median window and the spread."""
    calls, raw = _calls(spec, args)
    policy = JoinPolicy(wait_ms=WAIT_MS)
    schema = calls[0][0].rows.schema
    joins, cursors, results = {}, {}, {}
    for name, join_class in JOINS.items():
        gc.collect()
        tracemalloc.start()
        join = join_class(policy, schema)
        cursors[name] = _fill(join, calls, args.pending)
        traced = tracemalloc.get_traced_memory()[0] + getattr(join, "arrow_bytes", 0)
        tracemalloc.stop()
        # picasso's state counts its own buffers, the key index's C++ table among them,
        # which tracemalloc does not see; the dict joins are Python objects and the Arrow
        # tables they point at, which tracemalloc and arrow_bytes do see.
        state_bytes = join.nbytes() if hasattr(join, "nbytes") else traced
        joins[name] = join
        results[name] = {"pending": join.pending, "bytes_per_pending": state_bytes / join.pending,
                         "traced_bytes_per_pending": traced / join.pending, "windows": []}
    for _ in range(args.repeat):
        for name, join in joins.items():
            events, started = 0, time.perf_counter()
            while events < args.timed_events and cursors[name] < len(calls):
                call = calls[cursors[name]]
                cursors[name] += 1
                join.advance(*call)
                events += sum(len(part) for part in call[:2] if part is not None)
            results[name]["windows"].append(events / (time.perf_counter() - started))
    for name, result in results.items():
        result["events_per_s"] = statistics.median(result["windows"])
    results["raw_event_bytes"] = raw
    return results


# -- exactness and quality ------------------------------------------------------------------


def offline_samples(truth: pa.Table, wait_ms: int, late: str) -> dict[int, list[tuple[int, int]]]:
    """Per impression key, its samples (label, correction) by the policy, from the truth."""
    keys = join_keys([truth.column(REQUEST_ID)]).tolist()
    delays = truth.column("label_delay_ms").to_numpy()
    expected = {}
    for key, delay in zip(keys, delays.tolist()):
        if 0 <= delay <= wait_ms:
            expected[key] = [(1, 0)]
        elif delay > wait_ms and late == "correct":
            expected[key] = [(0, 0), (1, 1)]
        else:
            expected[key] = [(0, 0)]
    return expected


def joined_samples(calls, schema, policy: JoinPolicy) -> tuple[pa.Table, list[float], int]:
    """Every sample of the stream in order of emission, each sample's d̂ at emission, and
    how many were emitted while impressions still arrived. The rest come out after the
    last impression, as the late clicks move the watermark on in long strides, with no
    positive among them: a live stream never has such an end, and training on it would
    measure the end of the benchmark's stream (they count for the exactness check)."""
    join = JoinState(policy, schema)
    last_impressions = max(i for i, call in enumerate(calls) if call[0] is not None)
    parts, shares, live = [], [], 0
    for i, call in enumerate([*calls, (None, None, 2**62)]):
        out = join.advance(*call)
        if out.samples.num_rows:
            parts.append(out.samples)
            shares += [late_share(join.counts.positives, join.counts.late_labels)] * out.samples.num_rows
        if i <= last_impressions:
            live += out.samples.num_rows
    return pa.concat_tables(parts), shares, live


def label_errors(samples: pa.Table, expected: dict[int, list[tuple[int, int]]]) -> int:
    got: dict[int, list[tuple[int, int]]] = {}
    for key, label, correction in zip(samples.column(KEY_COLUMN).to_pylist(), samples.column("label").to_pylist(),
                                      samples.column(CORRECTION_COLUMN).to_pylist()):
        got.setdefault(key, []).append((int(label), int(correction)))
    return sum(1 for key in expected.keys() | got.keys() if sorted(got.get(key, [])) != sorted(expected.get(key, [])))


def train_and_score(spec, samples: pa.Table, held_out: pa.Table, labels: np.ndarray, batch: int,
                    mix: bool = True) -> float:
    """Train on the samples in their order, in batches as the joined stream cuts them
    (picasso.sample_join.sample_buffer), then score the held-out rows. Samples with a LATE_SHARE
    column train with the loss weights of late labels (the share at their emission)."""
    plan = PackingPlan.from_spec(spec)
    trainer = Trainer(spec, TrainConfig(device="cpu", seed=0))
    buffer = SampleBuffer(samples.schema, batch, window=4 if mix else 1)
    for start in range(0, samples.num_rows, batch):
        buffer.add(samples.slice(start, batch))
        for table in buffer.batches():
            packed = pack(table, spec, plan)
            if LATE_SHARE in table.column_names:
                packed = packed.with_late_share(float(np.mean(table.column(LATE_SHARE).to_numpy())))
            trainer.train_step(packed)
    return auc(labels, trainer.predict(pack(held_out, spec, plan)))


def quality(spec, args) -> dict:
    planted = PlantedModel(spec)
    # The stream lasts QUALITY_WAITS waits: a join emits no negative in its first W, and
    # the quality of a stream that short would be that of its start-up.
    config = EventStreamConfig(start_ms=START_MS, impressions_per_s=args.quality_rows / (QUALITY_WAITS * WAIT_MS / 1000))
    stream = make_event_stream(planted, args.quality_rows, stream=2, config=config)
    calls = calls_of(spec, stream, args.quality_call_events)
    schema = calls[0][0].rows.schema
    held = make_event_stream(planted, args.held_out_rows, stream=3, config=config)
    held_out = decoded_features(spec, held.impressions)
    held_labels = held.truth.column(spec.label).to_numpy().astype(np.float64)
    # Every model trains on the impressions more than W older than the last one: those a
    # live join has decided, every one of them.
    keys = join_keys([stream.truth.column(REQUEST_ID)])
    times = stream.truth.column(EVENT_TIME).to_numpy()
    cutoff = times.max() - WAIT_MS
    decided = set(keys[times < cutoff].tolist())
    results, trained = {}, {}
    for late in ("drop", "correct"):
        policy = JoinPolicy(wait_ms=WAIT_MS, late_labels=late, horizon_ms=24 * 3_600_000)
        samples, shares, live = joined_samples(calls, schema, policy)
        results[f"label_errors@{late}"] = label_errors(samples, offline_samples(stream.truth, WAIT_MS, late))
        samples, shares = samples.slice(0, live), np.array(shares[:live])
        kept = np.array([key in decided for key in samples.column(KEY_COLUMN).to_pylist()])
        trained[late] = samples.filter(pa.array(kept)), shares[kept].tolist()
        results[f"samples@{late}"] = int(kept.sum())
    # The true labels of the same impressions, in their order of arrival: no join, no delay.
    every = pa.concat_tables([call[0].rows for call in calls if call[0] is not None])
    truth_label = stream.truth.column(spec.label).to_numpy().astype(np.float32)
    every = every.set_column(every.schema.get_field_index("label"), "label", pa.array(truth_label))
    results["auc@true"] = train_and_score(spec, every.filter(pa.array(times < cutoff)), held_out, held_labels,
                                          args.batch, mix=False)
    results["samples@true"] = int(np.count_nonzero(times < cutoff))
    for late, (samples, shares) in trained.items():
        if late == "correct":
            samples = samples.append_column(LATE_SHARE, pa.array(shares, pa.float64()))
        results[f"auc@{late}"] = train_and_score(spec, samples, held_out, held_labels, args.batch)
    results["late_share"] = float(np.mean(stream.truth.column("label_delay_ms").to_numpy()[
        stream.truth.column("label_delay_ms").to_numpy() >= 0] > WAIT_MS))
    return results


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--pending", type=int, default=1_000_000, help="impressions waiting when timing starts"),
        p.add_argument("--timed-events", type=int, default=400_000),
        p.add_argument("--call-events", type=int, default=10_000, help="events per join call"),
        p.add_argument("--quality-rows", type=int, default=300_000, help="impressions the models train on"),
        p.add_argument("--quality-call-events", type=int, default=1_000,
                       help="events per join call in the quality runs (a poll's worth)"),
        p.add_argument("--held-out-rows", type=int, default=50_000),
        p.add_argument("--batch", type=int, default=1_000),
        p.add_argument("--smoke", action="store_true", help="a size that runs in seconds (overrides the sizes)"),
        p.set_defaults(repeat=3)))
    if args.smoke:
        vars(args).update(SMOKE)
    spec = criteo_spec()
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the join on one core
    speed = throughput(spec, args)
    os.sched_setaffinity(0, cpus)
    # spawn, not fork: the child's resident memory is its own, not the parent's pages.
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        resident = pool.submit(resident_growth, spec, args).result()
    quality_results = quality(spec, args)
    core, plain, reference = speed["picasso"], speed["dict join"], speed["reference join"]
    raw = speed["raw_event_bytes"]
    metrics = {
        "events_per_s": core["events_per_s"], "dict_join_events_per_s": plain["events_per_s"],
        "reference_join_events_per_s": reference["events_per_s"],
        "pending": core["pending"], "bytes_per_pending": core["bytes_per_pending"],
        "dict_join_bytes_per_pending": plain["bytes_per_pending"],
        "reference_join_bytes_per_pending": reference["bytes_per_pending"], "raw_event_bytes": raw,
        "traced_bytes_per_pending": core["traced_bytes_per_pending"],
        "rss_bytes_per_pending": resident["rss_growth"] / resident["pending"],
        # a smoke run's join is smaller than the allocator's slack: its growth may be <= 0
        "nbytes_over_rss": resident["nbytes"] / resident["rss_growth"] if resident["rss_growth"] > 0 else float("nan"),
        **{f"{key}events_per_s_spread": max(r["windows"]) - min(r["windows"])
           for key, r in (("", core), ("dict_join_", plain), ("reference_join_", reference))},
        "memory_over_raw": core["bytes_per_pending"] / raw,
        "label_errors": quality_results["label_errors@drop"] + quality_results["label_errors@correct"],
        **quality_results,
        "auc_delta@drop": quality_results["auc@drop"] - quality_results["auc@true"],
        "auc_delta@correct": quality_results["auc@correct"] - quality_results["auc@true"],
        "wait_ms": WAIT_MS, "call_events": args.call_events,
    }
    ratios = {"vs_dict_join": core["events_per_s"] / plain["events_per_s"],
              "vs_reference_join": core["events_per_s"] / reference["events_per_s"],
              "memory_target_over_measured": 2 * raw / core["bytes_per_pending"]}
    rows = [
        [f"events/s, {core['pending']:,} pending (one core)", core["events_per_s"], plain["events_per_s"],
         reference["events_per_s"]],
        [f"events/s spread over {args.repeat} windows in turns", metrics["events_per_s_spread"],
         metrics["dict_join_events_per_s_spread"], metrics["reference_join_events_per_s_spread"]],
        ["bytes per pending impression (picasso: nbytes; dicts: tracemalloc + Arrow)", core["bytes_per_pending"],
         plain["bytes_per_pending"], reference["bytes_per_pending"]],
        ["  picasso: tracemalloc's count / resident growth in a fresh process",
         f"{core['traced_bytes_per_pending']:.0f} / {metrics['rss_bytes_per_pending']:.0f}", "-", "-"],
        ["raw impression event (JSON bytes)", raw, raw, raw],
        ["label errors (drop + correct)", metrics["label_errors"], "-", "-"],
        ["AUC: true labels / drop / correct",
         f"{quality_results['auc@true']:.4f} / {quality_results['auc@drop']:.4f} / "
         f"{quality_results['auc@correct']:.4f}", "-", "-"],
    ]
    report("join", ["", "picasso", "dict join", "reference join"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
