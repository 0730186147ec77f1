"""A planted model whose item ids churn: new items arrive all the time and old ones fade.

The data set dynamic embedding tables (spec.DynamicTable) are for. A fixed table must hash
an unbounded id space into its rows, so items that live at the same time share rows and a
new item starts on what old ones left there; a dynamic table gives the live items rows of
their own and frees the rows of the dead.

The stream. Rows sit at positions t = 0, 1, 2, ... of one stream, counted across every
partition (picasso generate lays partitions end to end: pipelines.generate.first_position).
Item j is born at position b_j = j * birth_interval - head_start, where the head start of
HEAD_START lifetimes has the stream in its steady state from position 0 on (without it,
the first rows would all go to the first few items). The item of the impression at t is
- with probability popular_share, one of popular_items long-lived items, Zipf among them:
  the few heavy hitters a real catalogue has, alive all the time;
- otherwise an item already born, with probability ∝ exp(-(t - b_j) / lifetime): drawn as
  age ~ Exponential(lifetime), j = floor((t + head_start - age) / birth_interval),
  clipped to >= 0 (at position 0, one impression in e^HEAD_START).
A churning item thus gets (1 - popular_share) * birth_interval impressions over its life,
most of them in its first few lifetimes; ChurnConfig.alive_items counts the items live at
a time.

Item ids are a bijective scramble of the index j on 63 bits: no two items share an id,
and ids spread over [0, 2^63) (valid non-negative int64s, which hashed and dynamic fields
take as they are), far beyond any table.

The label: logit = bias + w_item + Σ_f w_f[token_f] + v · (log1p(dense) - 1), where
- w_item ~ Normal(0, sigma) is a hash of the item's id (the id space is unbounded: no
  table of effects), and sigma makes it most of the logit's variance, so that an item
  sharing its row with another costs real accuracy;
- the spec's other sparse fields draw Zipf-distributed tokens with effects of their own
  and its dense fields log-normal counts, as picasso.connectors.synthetic.planted does, so that a model has
  something besides the item to learn; the bias makes the click rate target_ctr.

Every row is a pure function of (spec, config, its position): its draws are hashes of
the position, not a generator's state, so a row is the same in whatever range it is
sampled, and a partition holds the same rows on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from picasso.kernels.hashing import hash_bytes, splitmix64_array
from picasso.spec import FeatureSpec, SparseField, SpecError
from picasso.connectors.synthetic.planted import MAX_TOKENS, TARGET_CTR, calibrate_bias, field_values, zipf_cdf

ITEM_FIELD = "item"
HEAD_START = 10  # lifetimes of births before position 0
_MASK63 = np.uint64(2**63 - 1)
# Rows the bias is calibrated on: a stretch of the stream past any date's rows.
_CALIBRATION = (2**40, 50_000)


@dataclass(frozen=True)
class ChurnConfig:
    """The defaults fit 10 days of 100,000 rows (1,000,000 positions): about 2,500 items
    are alive at a time while 23,600 pass through, each with about 45 impressions over its
    life (enough for a model to learn an item's effect, so that sharing its row costs
    accuracy; at 9 neither a shared nor an own row learns much); the true probabilities'
    AUC is about 0.79, and 0.61 without the item effects."""

    birth_interval: int = 50  # positions between two items' births
    lifetime: float = 40_000.0  # positions: the mean age of an impression's item
    sigma: float = 1.2  # std of the item effects: 85% of the logit's variance (the rest's std is 0.5)
    popular_items: int = 100
    popular_share: float = 0.1  # of the impressions, on the popular items
    alpha: float = 1.05  # Zipf exponent of the popular items and of the other fields' tokens
    field_weight_std: float = 0.5  # std of the other sparse fields' effects, summed
    dense_weight_std: float = 0.15
    missing_dense: float = 0.02
    target_ctr: float = TARGET_CTR
    seed: int = 0

    def __post_init__(self):
        if self.birth_interval < 1 or self.lifetime <= 0 or self.sigma < 0:
            raise ValueError("birth_interval must be >= 1, lifetime > 0 and sigma >= 0")
        if not 0 <= self.popular_share < 1 or (self.popular_share > 0 and self.popular_items < 1):
            raise ValueError("popular_share must be in [0, 1), with popular_items >= 1 when it is not 0")

    def alive_items(self, mass: float = 0.95) -> int:
        """Items alive at a time: the churning ones that take `mass` of the churning
        impressions (those born within lifetime * ln(1 / (1 - mass)) positions), and the
        popular ones."""
        span = self.lifetime * math.log(1 / (1 - mass))
        return math.ceil(span / self.birth_interval) + (self.popular_items if self.popular_share > 0 else 0)


@dataclass(frozen=True)
class ChurnRows:
    table: pa.Table  # in the spec's schema: the label, the dense fields, the sparse fields
    probabilities: np.ndarray  # true click probabilities
    item_index: np.ndarray  # j of each row's item (ChurnModel.born_at); popular items -1, -2, ...
    item_logit: np.ndarray  # w_item of each row: the item's part of the logit


@dataclass(frozen=True)
class _Ordinary:
    field: SparseField
    cdf: np.ndarray  # Zipf CDF over ranks
    weights: np.ndarray  # w_f[rank]
    salt: int  # of its tokens


def churn_problems(spec: FeatureSpec) -> list[str]:
    """Why the churn model cannot write rows in this spec's schema; empty if it can."""
    where = f"spec '{spec.name}'"
    if ITEM_FIELD not in spec.sparse_names:
        return [f"{where} has no sparse field '{ITEM_FIELD}': the churn model writes its churning item ids "
                f"there (the built-in spec 'churn' has one)"]
    problems = []
    item = spec.sparse_field(ITEM_FIELD)
    if not item.takes_strings or item.multi_hot:
        problems.append(f"{where}: field '{ITEM_FIELD}' must be one-hot, with hash_buckets or dynamic: its ids are "
                        "integers up to 2^63, which a vocab_size field refuses")
    bags = [f.name for f in spec.sparse if f.multi_hot and f.name != ITEM_FIELD]
    if bags:
        problems.append(f"{where}: the churn model draws one id a row for every field, and {', '.join(bags)} "
                        "are multi-hot")
    return problems


class ChurnModel:
    def __init__(self, spec: FeatureSpec, config: ChurnConfig = ChurnConfig()):
        problems = churn_problems(spec)
        if problems:
            raise SpecError(problems)
        self.spec = spec
        self.config = config
        rng = np.random.default_rng([config.seed, 11])
        others = [f for f in spec.sparse if f.name != ITEM_FIELD]
        weight_std = config.field_weight_std / math.sqrt(max(1, len(others)))  # the fields' sum keeps its std
        self.fields = []
        for f in others:
            tokens = min(f.num_rows, MAX_TOKENS)
            self.fields.append(_Ordinary(f, zipf_cdf(tokens, config.alpha), rng.normal(0, weight_std, tokens),
                                         salt=int(rng.integers(2**32))))
        self.dense_weights = rng.normal(0, config.dense_weight_std, len(spec.dense))
        self.popular_cdf = zipf_cdf(max(config.popular_items, 1), config.alpha)
        self.id_salt = np.uint64(rng.integers(2**63))
        self.head_start = math.ceil(HEAD_START * config.lifetime / config.birth_interval) * config.birth_interval
        self.bias = 0.0
        start, rows = _CALIBRATION
        self.bias = calibrate_bias(self._draw(np.arange(start, start + rows))[1], config.target_ctr)

    def born_at(self, index: np.ndarray) -> np.ndarray:
        """The stream position where churning items j (>= 0) are born."""
        return np.asarray(index, dtype=np.int64) * self.config.birth_interval - self.head_start

    def item_ids(self, index: np.ndarray) -> np.ndarray:
        """The ids of items j (int64 in [0, 2^63)): a bijection of j modulo 2^63, each step
        (add, multiply by an odd constant, xor-shift right) invertible on 63 bits."""
        with np.errstate(over="ignore"):
            x = (np.asarray(index, dtype=np.int64).view(np.uint64) + self.id_salt) & _MASK63
            x = (x * np.uint64(0x9E3779B97F4A7C15)) & _MASK63
            x ^= x >> np.uint64(31)
            x = (x * np.uint64(0xBF58476D1CE4E5B9)) & _MASK63
            x ^= x >> np.uint64(29)
        return x.view(np.int64)

    def item_effect(self, ids: np.ndarray) -> np.ndarray:
        """w_item of each item id: Normal(0, sigma), a hash of the id (so of j)."""
        return self.config.sigma * _normal(np.asarray(ids, dtype=np.int64), self.config.seed, "item effect")

    def _items(self, positions: np.ndarray) -> np.ndarray:
        """The item index of the impression at each position (see the module docstring)."""
        config, seed = self.config, self.config.seed
        age = -config.lifetime * np.log1p(-_uniform(positions, seed, "age"))  # Exponential(lifetime)
        born = np.floor((positions.astype(np.float64) + self.head_start - age) / config.birth_interval)
        index = np.maximum(born, 0).astype(np.int64)
        popular = _uniform(positions, seed, "popular") < config.popular_share
        rank = np.searchsorted(self.popular_cdf, _uniform(positions, seed, "popular rank"))
        return np.where(popular, -1 - rank, index)

    def _draw(self, positions: np.ndarray) -> tuple[dict[str, pa.Array], np.ndarray, np.ndarray, np.ndarray]:
        """The rows' columns but the label, their logits, item indices and item effects."""
        seed = self.config.seed
        index = self._items(positions)
        ids = self.item_ids(index)
        item_logit = self.item_effect(ids)
        logits = self.bias + item_logit
        columns: dict[str, pa.Array] = {ITEM_FIELD: pa.array(ids)}
        for truth in self.fields:
            ranks = np.searchsorted(truth.cdf, _uniform(positions, seed, f"field {truth.field.name}"))
            logits += truth.weights[ranks]
            columns[truth.field.name] = field_values(ranks, truth.field, truth.salt)
        for f, weight in zip(self.spec.dense, self.dense_weights):
            # Heavy-tailed counts, as picasso.connectors.synthetic.planted draws them.
            counts = np.floor(np.exp(1.0 + 1.5 * _normal(positions, seed, f"dense {f.name}")))
            logits += (np.log1p(counts) - 1.0) * weight
            missing = _uniform(positions, seed, f"missing {f.name}") < self.config.missing_dense
            columns[f.name] = pa.array(counts.astype(np.int64), mask=missing)
        return columns, logits, index, item_logit

    def draw(self, start: int, rows: int) -> ChurnRows:
        """The rows at positions start .. start + rows - 1, with what planted them."""
        positions = np.arange(start, start + rows, dtype=np.int64)
        columns, logits, index, item_logit = self._draw(positions)
        probabilities = 1 / (1 + np.exp(-logits))
        labels = (_uniform(positions, self.config.seed, "label") < probabilities).astype(np.int64)
        ordered = {self.spec.label: pa.array(labels)}
        ordered.update({f.name: columns[f.name] for f in self.spec.dense})
        ordered.update({f.name: columns[f.name] for f in self.spec.sparse})
        return ChurnRows(pa.table(ordered), probabilities, index, item_logit)

    def sample(self, start: int, rows: int) -> tuple[pa.Table, np.ndarray]:
        """`rows` raw rows from position `start` on, and their true click probabilities
        (PlantedModel.sample's pair, addressed by stream position)."""
        drawn = self.draw(start, rows)
        return drawn.table, drawn.probabilities


def _uniform(keys: np.ndarray, seed: int, purpose: str) -> np.ndarray:
    """A uniform in [0, 1) per key (a position, an item id), fixed by (seed, purpose, key):
    a hash, so no draw depends on which other keys are drawn with it."""
    salt = np.uint64(hash_bytes(f"churn {seed} {purpose}".encode()))
    bits = splitmix64_array(splitmix64_array(np.asarray(keys, dtype=np.int64).view(np.uint64)) ^ salt)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _normal(keys: np.ndarray, seed: int, purpose: str) -> np.ndarray:
    """A standard normal per key (Box-Muller over two of its uniforms)."""
    radius = np.sqrt(-2.0 * np.log1p(-_uniform(keys, seed, f"{purpose} radius")))
    return radius * np.cos(2 * np.pi * _uniform(keys, seed, f"{purpose} angle"))
