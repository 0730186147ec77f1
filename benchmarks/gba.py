"""GBA vs synchronous all-reduce vs plain async, with and without a straggler.

    python -m benchmarks.gba --json [--workers 4 --shards 1 --rows 20000 --straggler 3:4]

Setup (issue 6): W workers and S parameter-server shards on this machine, one torch
thread per process, planted synthetic data (each worker its own stream), the same
hyper-parameters and the same global batch (W local batches) in every mode, each mode
from a fresh model on W x --rows samples:
- sync:  torchrun --nproc-per-node W ... sync-worker: every rank trains --rows, a
         straggler stalls every step;
- async: `picasso ps --mode async` and W gba-workers, no aggregation, no staleness control;
- gba:   `picasso ps --mode gba` (M = W), the same workers.
In the PS modes the server stops the workers once W x --rows samples are counted
(--samples), so fast workers take the batches a straggler does not.

Measured: samples/s (samples over the slowest worker's training seconds; process start
and data planting are left out) and the held-out AUC of each mode's checkpoint on a
planted stream no worker trained on.

Ratios (higher is better for GBA): throughput_vs_sync and the AUC deltas, under the
straggler. Targets (issue 6): throughput_vs_sync >= 2.4, auc_delta_vs_sync >= -0.001,
auc_delta_vs_async >= 0, and without the straggler |auc gba - sync| <= 0.001.

Status: a skeleton. It runs every mode and reports; the targets have not been measured
or tuned yet.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
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
class ModeResult:
    mode: str
    straggler: str
    samples: int
    seconds: float  # the slowest worker's training time
    auc: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else float("nan")


def _extra(parser) -> None:
    parser.add_argument("--spec", default="criteo:26")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rows", type=int, default=81_920, help="samples per worker (the job: workers x rows)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--straggler", default="3:4", help="RANK:FACTOR for the straggler runs")
    parser.add_argument("--holdout", type=int, default=50_000, help="held-out rows for the AUC")


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


def run_sync(args, workdir: Path, straggler: str | None) -> tuple[int, float]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.workers),
               "--master-port", str(_free_port()), "-m", "picasso.pipelines.distributed_cli", "sync-worker",
               "--spec", args.spec, "--workdir", str(workdir), "--rows", str(args.rows),
               "--batch-size", str(args.batch_size), "--json", *_model_flags(args)]
    command += ["--straggler", straggler] if straggler else []
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), check=False)
    if done.returncode:
        raise RuntimeError(f"sync run failed:\n{done.stderr[-3000:]}")
    ranks = _json_lines(done.stdout)
    return ranks[0]["samples"], _span(ranks)


def run_ps_mode(args, mode: str, workdir: Path, straggler: str | None) -> tuple[int, float]:
    port, total = _free_port(), args.workers * args.rows
    group = ["--port", str(port), "--shards", str(args.shards), "--workers", str(args.workers), "--json"]
    server = subprocess.Popen([*CLI, "ps", "--spec", args.spec, "--workdir", str(workdir), "--mode", mode,
                               "--samples", str(total), *_model_flags(args), *group],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())
    # Each worker has rows enough for half the job: more than any one takes (a fast worker
    # takes about a third under the straggler), and the server's budget stops them.
    workers = [subprocess.Popen([*CLI, "gba-worker", "--rank", str(rank), "--rows", str(total // 2),
                                 "--batch-size", str(args.batch_size), *group,
                                 *(["--straggler", straggler] if straggler else [])],
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
    return _json_lines(out)[-1]["samples"], _span(stats)


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
    results: list[ModeResult] = []
    for straggler in (None, args.straggler):
        for mode in ("sync", "async", "gba"):
            with tempfile.TemporaryDirectory(prefix=f"gba-bench-{mode}-") as tmp:
                workdir = Path(tmp)
                if mode == "sync":
                    samples, seconds = run_sync(args, workdir, straggler)
                else:
                    samples, seconds = run_ps_mode(args, mode, workdir, straggler)
                results.append(ModeResult(mode, straggler or "none", samples, seconds, held_out_auc(args, workdir)))
    by = {(r.mode, r.straggler): r for r in results}
    slow = args.straggler
    ratios = {
        "throughput_vs_sync": by["gba", slow].samples_per_s / by["sync", slow].samples_per_s,
        "auc_delta_vs_sync": by["gba", slow].auc - by["sync", slow].auc,
        "auc_delta_vs_async": by["gba", slow].auc - by["async", slow].auc,
        "auc_delta_vs_sync_no_straggler": by["gba", "none"].auc - by["sync", "none"].auc,
    }
    metrics = {f"{r.mode}@{r.straggler}": {"samples": r.samples, "seconds": r.seconds,
                                             "samples_per_s": r.samples_per_s, "auc": r.auc} for r in results}
    rows = [[r.mode, r.straggler, r.samples, r.seconds, r.samples_per_s, f"{r.auc:.4f}"] for r in results]
    report("gba", ["mode", "straggler", "samples", "seconds", "samples/s", "auc"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
