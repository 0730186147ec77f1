"""GBA vs synchronous all-reduce vs plain async, with and without a straggler.

    python -m benchmarks.gba --json [--workers 4 --shards 1 --rows 81920 --straggler 3:4 --repeat 3
                                     --row-cache 10%]

Setup (issue 6): W workers and S parameter-server shards on this machine, one torch
thread per process, planted synthetic data (each worker its own stream), the same model
(wide & deep, MLP 256-128, criteo:26), the same hyper-parameters (the CLI's defaults:
Adam 1e-3 on the dense part, Adagrad 0.05 on the rows) and the same global batch (W local
batches of 512) in every mode, each mode from a fresh model on exactly W x --rows samples:
- sync:  torchrun --nproc-per-node W ... sync-worker: every rank trains --rows; a
         straggler stalls every step;
- async: `picasso ps --mode async` and W gba-workers: every push steps (M = 1), no
         staleness control;
- gba:   `picasso ps --mode gba` (M = W, default decay), the same workers.
- gba+cache (with --row-cache CAPACITY): gba with each worker's hot-row cache in front
         of the server (`gba-worker --row-cache`), which also reports the share of the
         workers' row pulls their caches served: PS traffic saved.
In the PS modes the server's budget (--samples W x --rows) stops the workers and refuses
pushes past it, so fast workers take the batches a straggler does not and every mode
trains on the same number of samples. Each PS worker is given half the job's rows, more
than any one takes.

The straggler (`--straggler RANK:FACTOR`, the same flag in every mode) times its own work
in each step (preparing the batch and computing gradients; in sync also stepping its
replica) and sleeps (FACTOR - 1) times that, so its work takes FACTOR times as long;
waiting on the network or on others is not stretched. Its sleep frees the CPU, as a slow
machine elsewhere would.

Why these sizes: the planted model's ceiling is AUC 0.89, and at the skeleton's 80k
samples (40 global steps) training is so early that a one-step staleness moved the AUC by
0.01 (measured in process: fresh vs 3 pushes of delay, 0.758 vs 0.745); at 4 x 81,920
samples (160 global steps) the same delay costs 0.0004, so the AUCs compare modes, not
how far along each is after a few dozen steps. Runs repeat round every setting (--repeat,
3) and the medians count, because other work on the machine moves a single run's
samples/s by up to 2x; each repeat draws its own planted streams (the same for every
mode), so the AUCs are not one draw of data's luck.

Measured per mode: samples/s (the samples trained into the model over the span from the
first worker's start to the last worker's end, wall clock; process start, joining and
data planting are left out: workers meet at a start line first), the held-out AUC of the
mode's checkpoint on 50,000 planted rows no worker trained on, and for the PS modes the
mean staleness (global steps between a counted gradient's pull and its push).

Ratios (higher is better for GBA): throughput_vs_sync and the AUC deltas, under the
straggler. Targets (issue 6): throughput_vs_sync >= 2.4, auc_delta_vs_sync >= -0.001,
auc_delta_vs_async >= 0, and without the straggler |auc gba - sync| <= 0.001.

Last measured with --row-cache 10% (2 cores, 1 shard, 2 repeats, a quiet machine):
throughput_vs_sync 3.75 (gba 34.5k samples/s, sync 9.2k under the straggler);
auc_delta_vs_sync -0.0013, no straggler -0.0013; auc_delta_vs_async -0.0030. The row
cache served 22.7% of the workers' row pulls at AUC within 0.001 of gba's, but gba+cache
ran at 28.5k samples/s: on loopback a pull costs less than the cache's bookkeeping.

Before that (2 cores, 1 shard, defaults, 3 repeats, other jobs on the machine):
throughput_vs_sync 4.01 (gba 32.5k samples/s, sync 8.1k under the straggler; 33.5k and
19.2k without); auc_delta_vs_sync -0.0013, no straggler -0.0010; auc_delta_vs_async
-0.0029. GBA's gradients are 0.7 global steps stale on average (the others' pushes
during one local batch: about (W-1)/M, the least any asynchronous scheme has), plain
async's 2.8 of its smaller steps; at this budget async's four times as many optimizer
steps still outweigh its staleness, and the AUCs of one draw of data spread by about
0.002, so the AUC targets sit within the noise of 3 repeats.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.harness import parse_args, report
from picasso import kernels
from picasso.checkpoint import latest_checkpoint
from picasso.pipelines.distributed_cli import planted_batches
from picasso.spec import load_spec
from picasso.trainer import TrainConfig, Trainer

CLI = [sys.executable, "-m", "picasso.pipelines.distributed_cli"]
HOLDOUT_STREAM = 9_999


@dataclass(frozen=True)
class Run:
    samples: int  # trained into the model (the server's count; sync: every rank's)
    seconds: float  # from the first worker's start to the last one's end
    staleness: float  # mean global steps between a counted gradient's pull and its push (sync: 0)
    auc: float = float("nan")
    served_share: float = float("nan")  # gba+cache: of the rows the workers needed, those their caches served


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


def _extra(parser) -> None:
    parser.add_argument("--spec", default="criteo:26")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rows", type=int, default=81_920, help="samples per worker (the job: workers x rows)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--straggler", default="3:4", help="RANK:FACTOR for the straggler runs")
    parser.add_argument("--holdout", type=int, default=50_000, help="held-out rows for the AUC")
    parser.add_argument("--row-cache", default=None, metavar="CAPACITY",
                        help="also run gba+cache: gba with each worker's hot-row cache of this size in front of "
                        "the server (gba-worker --row-cache), reporting the share of row pulls it served")
    parser.set_defaults(repeat=3)  # a run is minutes; medians of 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one torch thread per process


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _model_flags(args) -> list[str]:
    return ["--hidden", args.hidden]


def run_sync(args, workdir: Path, straggler: str | None, streams: int) -> Run:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.workers),
               "--master-port", str(_free_port()), "-m", "picasso.pipelines.distributed_cli", "sync-worker",
               "--spec", args.spec, "--workdir", str(workdir), "--rows", str(args.rows),
               "--batch-size", str(args.batch_size), "--stream-base", str(streams), "--json", *_model_flags(args)]
    command += ["--straggler", straggler] if straggler else []
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), check=False)
    if done.returncode:
        raise RuntimeError(f"sync run failed:\n{done.stderr[-3000:]}")
    ranks = _json_lines(done.stdout)
    return Run(ranks[0]["samples"], _span(ranks), 0.0)


def run_ps_mode(args, mode: str, workdir: Path, straggler: str | None, streams: int) -> Run:
    port, total = _free_port(), args.workers * args.rows
    group = ["--port", str(port), "--shards", str(args.shards), "--workers", str(args.workers), "--json"]
    cached = mode == "gba+cache"
    server = subprocess.Popen([*CLI, "ps", "--spec", args.spec, "--workdir", str(workdir),
                               "--mode", "gba" if cached else mode,
                               "--samples", str(total), *_model_flags(args), *group],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())
    # Each worker has rows enough for half the job: more than any one takes (a fast worker
    # takes about a third under the straggler), and the server's budget stops them.
    workers = [subprocess.Popen([*CLI, "gba-worker", "--rank", str(rank), "--rows", str(total // 2),
                                 "--batch-size", str(args.batch_size), "--stream-base", str(streams), *group,
                                 *(["--straggler", straggler] if straggler else []),
                                 *(["--row-cache", args.row_cache] if cached else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
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
    return Run(_json_lines(out)[-1]["samples"], _span(stats), staleness, served_share=served)


def _span(runs: list[dict]) -> float:
    """From the first worker's start to the last one's end (wall clock, one machine)."""
    return max(r["ended"] for r in runs) - min(r["began"] for r in runs)


def held_out_auc(args, workdir: Path) -> float:
    spec = load_spec(args.spec)
    trainer = Trainer(spec, TrainConfig(hidden=tuple(int(s) for s in args.hidden.split(",")), log_every=0,
                                        device="cpu"))
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    return trainer.evaluate(planted_batches(spec, args.holdout, 4096, HOLDOUT_STREAM)).auc


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _extra)
    kernels.backend_for(torch.device("cpu"))  # build (or load) the C++ kernels once, before any timed run
    runs: dict[tuple[str, str], list[Run]] = {}
    # Repeats go round every setting in turn, so a change of load on the machine falls on
    # every mode alike rather than on one mode's runs.
    for repeat in range(args.repeat):
        streams = 100 + 1000 * repeat  # each repeat its own draw of data, the same for every mode
        for straggler in (None, args.straggler):
            for mode in ("sync", "async", "gba", *(["gba+cache"] if args.row_cache else [])):
                with tempfile.TemporaryDirectory(prefix=f"gba-bench-{mode}-") as tmp:
                    workdir = Path(tmp)
                    run = run_sync(args, workdir, straggler, streams) if mode == "sync" else \
                        run_ps_mode(args, mode, workdir, straggler, streams)
                    run = replace(run, auc=held_out_auc(args, workdir))
                runs.setdefault((mode, straggler or "none"), []).append(run)
                print(f"{mode:5} straggler {straggler or 'none':5} {run}", flush=True)
    results = [ModeResult(mode, straggler, tuple(r)) for (mode, straggler), r in runs.items()]
    by = {(r.mode, r.straggler): r for r in results}
    slow = args.straggler
    ratios = {
        "throughput_vs_sync": by["gba", slow].samples_per_s / by["sync", slow].samples_per_s,
        "auc_delta_vs_sync": by["gba", slow].auc - by["sync", slow].auc,
        "auc_delta_vs_async": by["gba", slow].auc - by["async", slow].auc,
        "auc_delta_vs_sync_no_straggler": by["gba", "none"].auc - by["sync", "none"].auc,
    }
    metrics = {f"{r.mode}@{r.straggler}": {"samples": r.samples, "samples_per_s": r.samples_per_s, "auc": r.auc,
                                             "staleness": r.staleness, "row_cache_served_share": r.served_share,
                                             "runs": [asdict(run) for run in r.runs]}
               for r in results}
    rows = [[r.mode, r.straggler, r.samples, r.samples_per_s, f"{r.auc:.4f}", f"{r.staleness:.2f}",
             "" if r.served_share != r.served_share else f"{r.served_share:.1%}"] for r in results]
    report("gba", ["mode", "straggler", "samples", "samples/s", "auc", "staleness", "pulls served by row cache"],
           rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
