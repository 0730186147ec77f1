"""GBA vs synchronous all-reduce vs plain async, with and without a straggler.

    python -m benchmarks.gba --json [--workers 4 --shards 1 --rows 81920 --warm-rows 245760
                                     --straggler 3:4 --repeat 3 --row-cache 10%]

W workers and S parameter-server shards on this machine, one torch thread per process,
planted synthetic data (each worker its own stream), the same model (wide & deep, MLP
256-128, criteo:26), the same hyper-parameters (the CLI's defaults) and the same global
batch (W local batches of 512) in every mode. Every mode resumes the same job and trains
it on exactly W x --rows more samples: continuous training, switching modes with nothing
changed but --mode, which is what GBA is for. The job is a model trained in sync on
--warm-rows samples per worker of streams of its own (in process, benchmarks/gba_inprocess.py),
with its optimizer state, as a checkpoint in each mode's workdir; --warm-rows 0 starts
every mode from a fresh model instead.
- sync:  torchrun --nproc-per-node W ... sync-worker: the ranks all-reduce dense gradients
         and gather row gradients, and each applies the reduced gradient once; a straggler
         stalls every step;
- async: `picasso ps --mode async` and W gba-workers: every push steps (M = 1), no
         staleness control;
- gba:   `picasso ps --mode gba` (M = W, default decay), the same workers;
- gba+cache (with --row-cache CAPACITY): gba with each worker's hot-row cache in front
         of the server (`gba-worker --row-cache`), also reporting the share of the
         workers' row pulls their caches served.
In the PS modes the server's budget (--samples W x --rows) stops the workers and refuses
pushes past it, so fast workers take the batches a straggler does not and every mode
trains on the same number of samples.

The straggler (`--straggler RANK:FACTOR`, the same flag in every mode) times its own work
in each step and sleeps (FACTOR - 1) times that, so its work takes FACTOR times as long;
waiting on the network or on others is not stretched, and its sleep frees the CPU, as a
slow machine elsewhere would.

Why resume a trained job: from a fresh model the first hundred-odd global steps decide the
AUC, and there GBA's staleness and async's extra optimizer steps weigh more than they do
on a trained model (benchmarks.gba_staleness measures both with the push order fixed). A
continuous-training job is a trained model taking in new data, so its figures are the
ones that count; --warm-rows 0 gives the others. Runs repeat round every setting
(--repeat) and the medians count, because other work on the machine moves a single run's
samples/s a lot; each repeat draws its own planted streams and trains its own start model
(the same for every mode).

Measured per mode: samples/s (the samples trained into the model over the span from the
first worker's start to the last worker's end; process start, joining and data planting
are left out: workers meet at a start line first), the held-out AUC of the mode's
checkpoint on --holdout planted rows no worker trained on, and for the PS modes the mean
staleness (global steps between a counted gradient's pull and its push); for sync, the
share of a rank's step spent applying the global gradient to its replica (metrics
sync_apply_share: sync here is replicated, every rank applies every rank's rows).
Ratios (higher is better for GBA): throughput_vs_sync and the AUC deltas, under the
straggler. --row-gradient (the same flag in sync and GBA) picks how a row's gradient is
averaged: global-mean, one big batch's (the default), or touched-mean.

The churn run (--no-churn leaves it out): gba without a straggler on --churn-rows per
worker (more than --rows: the replacement needs time to start and train); the last worker
is killed with SIGKILL once half the job is trained, and a new process with its rank joins
the running job and reads its source on from the server's positions. Reported: samples/s
before the kill, from the kill until the replacement trains, and after; the seconds from
the replacement's process start to its first batch; and the ledger of every sample
(trained plus dropped as too stale equals what the checkpoint's positions cover, and the
trained ranges have no holes).

Measured figures: README.md, "Distributed training" (What to expect).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.gba_inprocess import HOLDOUT_STREAM, WARM_STREAM_BASE, warm_up
from benchmarks.harness import parse_args, print_table, report, sized
from picasso import kernels
from picasso.checkpoint import latest_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.distributed.aggregation import ROW_GRADIENTS
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

CLI = [sys.executable, "-m", "picasso.pipelines.cli.distributed"]


@dataclass(frozen=True)
class Run:
    samples: int  # trained into the model (the server's count; sync: every rank's)
    seconds: float  # from the first worker's start to the last one's end
    staleness: float  # mean global steps between a counted gradient's pull and its push (sync: 0)
    auc: float = float("nan")
    served_share: float = float("nan")  # gba+cache: of the rows the workers needed, those their caches served
    # sync: of a rank's time in steps, the share it spent applying the global gradient to its
    # replica (every rank applies every rank's rows: sync here is replicated), ranks' mean
    apply_share: float = float("nan")


@dataclass(frozen=True)
class ModeResult:
    """One mode under one straggler setting: the median of its --repeat runs."""

    mode: str
    straggler: str
    runs: tuple[Run, ...]

    @property
    def samples(self) -> int:
        return self.runs[0].samples

    @property
    def samples_per_s(self) -> float:
        return statistics.median(r.samples / r.seconds for r in self.runs)

    @property
    def auc(self) -> float:
        return statistics.median(r.auc for r in self.runs)

    @property
    def staleness(self) -> float:
        return statistics.median(r.staleness for r in self.runs)

    @property
    def served_share(self) -> float:
        return statistics.median(r.served_share for r in self.runs)

    @property
    def apply_share(self) -> float:
        return statistics.median(r.apply_share for r in self.runs)


# --smoke: two workers and a few batches each, to prove every mode still runs, under the
# straggler only (each run starts several processes: most of a smoke run's time). The churn
# run is left out: at this size the others finish the job before a replacement process
# could start, so it would measure nothing.
SMOKE = {"workers": 2, "rows": 1024, "batch_size": 256, "straggler": "1:4", "holdout": 2048, "warm_rows": 1024,
         "churn": False, "repeat": 1}


def _extra(parser) -> None:
    parser.add_argument("--spec", default="criteo:26")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rows", type=int, default=81_920, help="samples per worker (the job: workers x rows)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--straggler", default="3:4", help="RANK:FACTOR for the straggler runs")
    parser.add_argument("--holdout", type=int, default=50_000, help="held-out rows for the AUC")
    parser.add_argument("--warm-rows", type=int, default=245_760,
                        help="every mode resumes one model trained in sync on this many samples per worker "
                        "(streams of its own): continuous training switching modes (0: a fresh model)")
    parser.add_argument("--row-cache", default=None, metavar="CAPACITY",
                        help="also run gba+cache: gba with each worker's hot-row cache of this size in front of "
                        "the server (gba-worker --row-cache), reporting the share of row pulls it served")
    parser.add_argument("--row-gradient", choices=ROW_GRADIENTS, default=ROW_GRADIENTS[0],
                        help="how sync and GBA average a row's gradient (the same flag in both modes)")
    parser.add_argument("--no-churn", dest="churn", action="store_false",
                        help="leave out the churn run (a gba worker killed halfway and replaced)")
    parser.add_argument("--churn-rows", type=int, default=327_680, help="samples per worker in the churn run")
    parser.set_defaults(repeat=3)  # a run is minutes; medians of 3


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one torch thread per process


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _model_flags(args) -> list[str]:
    """The flags sync-worker and `picasso ps` take alike."""
    return ["--hidden", args.hidden, "--row-gradient", args.row_gradient]


def run_sync(args, workdir: Path, straggler: str | None, streams: int) -> Run:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.workers),
               "--master-port", str(free_port()), "-m", "picasso.pipelines.cli.distributed", "sync-worker",
               "--spec", args.spec, "--workdir", str(workdir), "--rows", str(args.rows),
               "--batch-size", str(args.batch_size), "--stream-base", str(streams), "--json", *_model_flags(args)]
    command += ["--straggler", straggler] if straggler else []
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), check=False)
    if done.returncode:
        raise RuntimeError(f"sync run failed:\n{done.stderr[-3000:]}")
    ranks = _json_lines(done.stdout)
    apply_share = statistics.mean(rank["apply_s"] / rank["step_s"] for rank in ranks)
    return Run(ranks[0]["samples"], _span(ranks), 0.0, apply_share=apply_share)


def _start_server(args, workdir: Path, mode: str, port: int, samples: int) -> subprocess.Popen:
    """`picasso ps` for one run: it stops the workers once `samples` are trained."""
    return subprocess.Popen([*CLI, "ps", "--spec", args.spec, "--workdir", str(workdir), "--mode", mode,
                             "--shards", str(args.shards), "--workers", str(args.workers), "--samples", str(samples),
                             *_model_flags(args), "--port", str(port), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())


def _start_worker(args, rank: int, rows: int, streams: int, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "gba-worker", "--rank", str(rank), "--rows", str(rows), "--batch-size",
                             str(args.batch_size), "--stream-base", str(streams), "--port", str(port), "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def run_ps_mode(args, mode: str, workdir: Path, straggler: str | None, streams: int, trained_before: int) -> Run:
    """trained_before: samples in the model the server resumes (its count includes them)."""
    port, total = free_port(), args.workers * args.rows
    cached = mode == "gba+cache"
    server = _start_server(args, workdir, "gba" if cached else mode, port, total)
    # Each worker has rows enough for half the job: more than any one takes (a fast worker
    # takes about a third under the straggler), and the server's budget stops them.
    workers = [_start_worker(args, rank, total // 2, streams, port,
                             *(["--straggler", straggler] if straggler else []),
                             *(["--row-cache", args.row_cache] if cached else []))
               for rank in range(args.workers)]
    stats = []
    for worker in workers:
        out, err = worker.communicate()
        if worker.returncode:
            raise RuntimeError(f"{mode} worker failed:\n{err[-3000:]}")
        stats.extend(_json_lines(out))
    out, _ = server.communicate()
    if server.returncode:
        raise RuntimeError(f"{mode} server failed")
    staleness = sum(w["mean_staleness"] * w["batches"] for w in stats) / max(1, sum(w["batches"] for w in stats))
    served = sum(w["row_cache_rows_served"] for w in stats) / sum(w["row_cache_rows_asked"] for w in stats) \
        if cached else float("nan")
    return Run(_json_lines(out)[-1]["samples"] - trained_before, _span(stats), staleness, served_share=served)


@dataclass(frozen=True)
class Churn:
    """A gba run in which one worker is killed (SIGKILL) halfway and a new process replaces it."""

    before: float  # samples/s from the start to the kill
    during: float  # from the kill until the replacement trains
    after: float  # from then to the end
    seconds_to_train: float  # from the replacement's process start to its first batch
    trained: int  # samples in the model
    covered: int  # samples the checkpoint's positions cover: each trained once, or dropped as too stale
    dropped_stale: int  # samples dropped as too stale (counted, on purpose untrained)
    duplicates: int  # pushes acknowledged as already trained (the dead one's, replayed)
    holes: int  # positions inside the covered span the ledger does not hold: lost samples

    @property
    def exactly_once(self) -> bool:
        return self.trained + self.dropped_stale == self.covered and self.holes == 0


def run_churn(args, workdir: Path, streams: int, trained_before: int) -> Churn:
    """gba without a straggler; the last worker is killed once half the job is trained, and
    a replacement with its rank joins the running job and reads its source on from the
    server's positions. The server is polled for its sample count (its `status` call)."""
    from picasso.checkpoint import read_applied
    from picasso.distributed.param_server import ServerAddress

    # Longer than the other runs: the kill comes halfway, and the replacement must have time
    # to start (a Python process, the kernels, its planted data) and train before the end.
    port, total, doomed = free_port(), args.workers * args.churn_rows, args.workers - 1
    if args.churn_rows % args.batch_size:
        raise ValueError("the churn run counts stale drops in whole batches: --rows must be a multiple of --batch-size")
    server = _start_server(args, workdir, "gba", port, total)
    workers = [_start_worker(args, rank, total // 2, streams, port) for rank in range(args.workers)]
    status = ServerAddress("127.0.0.1", port, timeout_s=60).connect(0)
    if not status.wait_ready(60):
        raise RuntimeError("the churn run's server did not come up")
    trained, polls = 0, []
    while trained < total // 2:
        time.sleep(0.2)
        trained = status.call("status")["samples"] - trained_before
        polls.append((time.time(), trained))
    workers[doomed].kill()
    killed = time.time()
    workers[doomed].communicate()
    # The replacement reads on from the server's positions for its share of what is left:
    # planted data is drawn from a stream's start, so asking for more would only make its
    # start slower (the others take whatever it leaves).
    remaining = total - status.call("status")["samples"] + trained_before
    share = -(-remaining // args.workers // args.batch_size) * args.batch_size
    replacement, started = _start_worker(args, doomed, share, streams, port), time.time()
    first_batch = _wait_for_line(replacement, "training from step")
    trains = time.time()
    while server.poll() is None:
        try:
            polls.append((time.time(), status.call("status")["samples"] - trained_before))
        except Exception:  # the server ended between the poll and the call
            break
        time.sleep(0.2)
    status.close()
    stats = []
    for process in [*workers[:doomed], *workers[doomed + 1:], replacement]:
        out, err = process.communicate()
        if process.returncode:
            raise RuntimeError(f"churn worker {process.args[3:6]} failed ({process.returncode}):\n{err[-3000:]}")
        stats.extend(_json_lines(out))
    out, _ = server.communicate()
    if server.returncode or first_batch is None:
        raise RuntimeError("churn server failed" if server.returncode else "the replacement never trained")
    summary = _json_lines(out)[-1]
    began, ended = min(s["began"] for s in stats), max(s["ended"] for s in stats)
    sources = [f"planted-{streams + rank}" for rank in range(args.workers)]
    positions = summary["positions"]
    applied = read_applied(summary["checkpoint"]) or {}
    holes = sum(positions[s] - sum(b - a for a, b in applied.get(s, []) if b <= positions[s]) for s in sources)
    return Churn(
        before=_rate(polls, began, killed), during=_rate(polls, killed, trains), after=_rate(polls, trains, ended),
        seconds_to_train=trains - started, trained=summary["samples"] - trained_before,
        covered=sum(positions[s] for s in sources), dropped_stale=summary["counts"]["dropped_stale"] * args.batch_size,
        duplicates=summary["counts"]["duplicate"], holes=holes)


def _wait_for_line(process: subprocess.Popen, text: str) -> str | None:
    """Read a process's log until a line holds `text`; None (and the log echoed) when it ended first."""
    seen = []
    for line in process.stderr:
        if text in line:
            return line
        seen.append(line)
    sys.stderr.write("".join(seen[-30:]))
    return None


def _rate(polls: list[tuple[float, int]], start: float, end: float) -> float:
    """Samples/s between two wall-clock times, from the polls nearest them."""
    def at(t: float) -> tuple[float, int]:
        return min(polls, key=lambda poll: abs(poll[0] - t))

    (t0, n0), (t1, n1) = at(start), at(end)
    return (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")


def _span(runs: list[dict]) -> float:
    """From the first worker's start to the last one's end (wall clock, one machine)."""
    return max(r["ended"] for r in runs) - min(r["began"] for r in runs)


def _train_config(args) -> TrainConfig:
    """The model and hyper-parameters every mode trains (the CLI's defaults but --hidden)."""
    return TrainConfig(hidden=tuple(int(s) for s in args.hidden.split(",")), log_every=0, device="cpu")


def held_out_auc(args, workdir: Path) -> float:
    spec = load_spec(args.spec)
    trainer = Trainer(spec, _train_config(args))
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    return trainer.evaluate(planted_batches(spec, args.holdout, 4096, HOLDOUT_STREAM)).auc


def _resuming(base: str | None, workdir: Path) -> Path:
    """A run's workdir holding a copy of the job every mode resumes (`picasso ps` and
    sync-worker find it under checkpoints/), or nothing with --warm-rows 0."""
    if base is not None:  # warm_up returns the storage API's path: a string
        shutil.copytree(base, workdir / "checkpoints" / Path(base).name)
    return workdir


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _extra, smoke=SMOKE)
    kernels.backend_for(torch.device("cpu"))  # build (or load) the C++ kernels once, before any timed run
    runs: dict[tuple[str, str], list[Run]] = {}
    churns: list[Churn] = []
    # Repeats go round every setting in turn, so a change of load on the machine falls on
    # every mode alike rather than on one mode's runs.
    for repeat in range(args.repeat):
        streams = 100 + 1000 * repeat  # each repeat its own draw of data, the same for every mode
        with tempfile.TemporaryDirectory(prefix="gba-bench-base-") as base_dir:
            base = warm_up(Trainer(load_spec(args.spec), _train_config(args)), args.workers, args.batch_size,
                           args.warm_rows, WARM_STREAM_BASE + 1000 * repeat, Path(base_dir)) if args.warm_rows else None
            for straggler in sized(args, (None, args.straggler), (args.straggler,)):
                for mode in ("sync", "async", "gba", *(["gba+cache"] if args.row_cache else [])):
                    with tempfile.TemporaryDirectory(prefix=f"gba-bench-{mode}-") as tmp:
                        workdir = _resuming(base, Path(tmp))
                        run = run_sync(args, workdir, straggler, streams) if mode == "sync" else \
                            run_ps_mode(args, mode, workdir, straggler, streams, args.workers * args.warm_rows)
                        run = replace(run, auc=held_out_auc(args, workdir))
                    runs.setdefault((mode, straggler or "none"), []).append(run)
                    print(f"{mode:5} straggler {straggler or 'none':5} {run}", flush=True)
            if args.churn:
                with tempfile.TemporaryDirectory(prefix="gba-bench-churn-") as tmp:
                    workdir = _resuming(base, Path(tmp))
                    churns.append(run_churn(args, workdir, streams, args.workers * args.warm_rows))
                print(f"churn {churns[-1]}", flush=True)
    results = [ModeResult(mode, straggler, tuple(r)) for (mode, straggler), r in runs.items()]
    by = {(r.mode, r.straggler): r for r in results}
    slow = args.straggler
    ratios = {
        "throughput_vs_sync": by["gba", slow].samples_per_s / by["sync", slow].samples_per_s,
        "auc_delta_vs_sync": by["gba", slow].auc - by["sync", slow].auc,
        "auc_delta_vs_async": by["gba", slow].auc - by["async", slow].auc,
    }
    if ("gba", "none") in by:  # not under --smoke
        ratios["auc_delta_vs_sync_no_straggler"] = by["gba", "none"].auc - by["sync", "none"].auc
    # Sync's replicated apply, of its step: without the straggler where there is that run
    # (with it, the other ranks' waiting dilutes the share).
    unstalled = by.get(("sync", "none"), by["sync", slow])
    metrics = {"sync_apply_share": unstalled.apply_share, "sync_apply_share_straggler": by["sync", slow].apply_share,
               "row_gradient": args.row_gradient}
    metrics |= {f"{r.mode}@{r.straggler}": {"samples": r.samples, "samples_per_s": r.samples_per_s, "auc": r.auc,
                                             "staleness": r.staleness, "row_cache_served_share": r.served_share,
                                             "runs": [asdict(run) for run in r.runs]}
               for r in results}
    if churns:
        median = lambda field: statistics.median(getattr(c, field) for c in churns)  # noqa: E731
        metrics["churn"] = {"before_samples_per_s": median("before"), "during_samples_per_s": median("during"),
                            "after_samples_per_s": median("after"), "seconds_to_train": median("seconds_to_train"),
                            "exactly_once": all(c.exactly_once for c in churns),
                            "runs": [asdict(c) | {"exactly_once": c.exactly_once} for c in churns]}
        ratios["churn_after_over_before"] = median("after") / median("before")
        print_table("gba churn: worker killed halfway, a new process replaces it",
                    ["run", "before /s", "during /s", "after /s", "s to train", "trained", "stale", "dups", "holes",
                     "once"],
                    [[i, c.before, c.during, c.after, f"{c.seconds_to_train:.2f}", c.trained, c.dropped_stale,
                      c.duplicates, c.holes, c.exactly_once] for i, c in enumerate(churns)])
    share = lambda value: "" if value != value else f"{value:.1%}"  # noqa: E731 - nan: not measured
    rows = [[r.mode, r.straggler, r.samples, r.samples_per_s, f"{r.auc:.4f}", f"{r.staleness:.2f}",
             share(r.served_share), share(r.apply_share)] for r in results]
    report("gba", ["mode", "straggler", "samples", "samples/s", "auc", "staleness", "pulls served by row cache",
                   "sync apply share"], rows, ratios, metrics, args.json, caption=f"--row-gradient {args.row_gradient}")


if __name__ == "__main__":
    main()
