"""Synthetic rows in a spec's schema, with labels from a planted ground-truth model.

No public CTR data set of useful size can be had offline, so the generator makes rows
shaped like Criteo's:
- sparse ids follow a Zipf law (rank r has probability ∝ r^-alpha), the few-hot-ids
  skew that caching exploits. Hashed and dynamic fields carry 8-hex-digit string tokens,
  vocab fields integer ids; multi-hot fields carry 1..max_len ids;
- dense fields are heavy-tailed counts (log-normal), 2% missing;
- labels are drawn from a planted logistic model over the raw tokens:
    logit = bias + Σ_field w_f[token] + v · log1p(dense) + Σ_pairs <u_a[token_a], u_b[token_b]>
  so they are learnable, with a known ceiling: the AUC of the true probabilities.

Everything is a pure function of (spec, seed): the same planted model labels every day,
while each day's rows come from their own stream. picasso.connectors.synthetic.churn builds a model
whose item ids churn from the same pieces (zipf_cdf, field_values, calibrate_bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from picasso.spec import FeatureSpec, SparseField

TARGET_CTR = 0.25  # Criteo's click rate is about this
MAX_TOKENS = 200_000  # distinct tokens per field at most: keeps the planted model small


@dataclass(frozen=True)
class SyntheticConfig:
    alpha: float = 1.05  # Zipf exponent of the ids
    seed: int = 0  # fixes the planted model
    field_weight_std: float = 0.45
    dense_weight_std: float = 0.15
    interaction_pairs: int = 4
    interaction_dim: int = 4
    missing_dense: float = 0.02


@dataclass
class _FieldTruth:
    field: SparseField
    cdf: np.ndarray  # Zipf CDF over ranks
    weights: np.ndarray  # w_f[rank]
    salt: int


class PlantedModel:
    def __init__(self, spec: FeatureSpec, config: SyntheticConfig = SyntheticConfig()):
        self.spec = spec
        self.config = config
        rng = np.random.default_rng([config.seed, 1])
        # Keep the ceiling near Criteo-like difficulty whatever the field count: the
        # variance of the summed field weights stays that of 26 fields.
        weight_std = config.field_weight_std * min(1.0, (26 / len(spec.sparse)) ** 0.5)
        self.fields = []
        for i, f in enumerate(spec.sparse):
            tokens = min(f.num_rows, MAX_TOKENS)
            self.fields.append(
                _FieldTruth(f, zipf_cdf(tokens, config.alpha), rng.normal(0, weight_std, tokens),
                            salt=int(rng.integers(2**32)))
            )
        self.dense_weights = rng.normal(0, config.dense_weight_std, len(spec.dense))
        pairs = min(config.interaction_pairs, len(spec.sparse) // 2)
        chosen = rng.choice(len(spec.sparse), size=2 * pairs, replace=False)
        self.pairs = [
            (int(a), int(b), rng.normal(0, 0.5, (len(self.fields[a].cdf), config.interaction_dim)),
             rng.normal(0, 0.5, (len(self.fields[b].cdf), config.interaction_dim)))
            for a, b in chosen.reshape(-1, 2)
        ]
        self.bias = 0.0
        self.bias = calibrate_bias(self._draw(np.random.default_rng([config.seed, 2]), 20_000)[1])

    def _draw(self, rng: np.random.Generator, rows: int) -> tuple[dict[str, pa.Array], np.ndarray]:
        columns: dict[str, pa.Array] = {}
        logits = np.full(rows, self.bias)
        first_rank = {}
        for truth in self.fields:
            f = truth.field
            if f.multi_hot:
                lengths = rng.integers(1, f.max_len + 1, rows)
            else:
                lengths = np.ones(rows, dtype=np.int64)
            ranks = np.searchsorted(truth.cdf, rng.random(int(lengths.sum())))
            owner = np.repeat(np.arange(rows), lengths)
            logits += np.bincount(owner, truth.weights[ranks], minlength=rows) / lengths
            starts = np.cumsum(lengths) - lengths
            first_rank[f.name] = ranks[starts]
            values = field_values(ranks, f, truth.salt)
            if f.multi_hot:
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                columns[f.name] = pa.ListArray.from_arrays(pa.array(offsets), values)
            else:
                columns[f.name] = values
        for a, b, u_a, u_b in self.pairs:
            name_a, name_b = self.spec.sparse[a].name, self.spec.sparse[b].name
            logits += np.einsum("nd,nd->n", u_a[first_rank[name_a]], u_b[first_rank[name_b]]) * 0.5
        counts = np.floor(np.exp(rng.normal(1.0, 1.5, (rows, len(self.spec.dense)))))
        logits += (np.log1p(counts) - 1.0) @ self.dense_weights
        missing = rng.random(counts.shape) < self.config.missing_dense
        for j, f in enumerate(self.spec.dense):
            columns[f.name] = pa.array(counts[:, j].astype(np.int64), mask=missing[:, j])
        return columns, logits

    def sample(self, rows: int, stream: int) -> tuple[pa.Table, np.ndarray]:
        """`rows` raw rows from stream number `stream` (a day, say), and their true click
        probabilities."""
        rng = np.random.default_rng([self.config.seed, 3, stream])
        columns, logits = self._draw(rng, rows)
        probabilities = 1 / (1 + np.exp(-logits))
        labels = (rng.random(rows) < probabilities).astype(np.int64)
        ordered = {self.spec.label: pa.array(labels)}
        ordered.update({f.name: columns[f.name] for f in self.spec.dense})
        ordered.update({f.name: columns[f.name] for f in self.spec.sparse})
        return pa.table(ordered), probabilities


def zipf_cdf(tokens: int, alpha: float) -> np.ndarray:
    """The CDF over ranks 1..tokens of a Zipf law with exponent alpha; a rank is
    searchsorted(cdf, uniform), 0-based."""
    cdf = np.cumsum(np.arange(1, tokens + 1, dtype=np.float64) ** -alpha)
    return cdf / cdf[-1]


def calibrate_bias(logits: np.ndarray, target: float = TARGET_CTR) -> float:
    """The bias that makes the mean click probability of these bias-free logits `target`."""
    low, high = -20.0, 20.0
    for _ in range(60):
        mid = (low + high) / 2
        if (1 / (1 + np.exp(-(logits + mid)))).mean() < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def field_values(ranks: np.ndarray, f: SparseField, salt: int) -> pa.Array:
    """The raw ids of 0-based ranks of field f: string tokens where the field takes strings
    (hashed and dynamic fields, like Criteo's), else integer ids in [0, vocab_size)."""
    return _tokens(ranks, salt) if f.takes_strings else pa.array(_vocab_ids(ranks, f, salt))


def _scramble(ranks: np.ndarray, salt: int) -> np.ndarray:
    """A bijection of 32-bit ranks, so hot tokens are not simply the small numbers."""
    with np.errstate(over="ignore"):
        return (ranks.astype(np.uint64) * np.uint64(2654435761) + np.uint64(salt)) & np.uint64(0xFFFFFFFF)


def _tokens(ranks: np.ndarray, salt: int) -> pa.Array:
    """8-hex-digit string tokens, like Criteo's categorical values, built without a loop."""
    values = _scramble(ranks, salt)
    shifts = np.arange(28, -4, -4, dtype=np.uint64)
    nibbles = ((values[:, None] >> shifts) & np.uint64(0xF)).astype(np.uint8)
    chars = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[nibbles]
    offsets = np.arange(0, 8 * len(values) + 1, 8, dtype=np.int32)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def _vocab_ids(ranks: np.ndarray, f: SparseField, salt: int) -> np.ndarray:
    return (_scramble(ranks, salt) % np.uint64(f.vocab_size)).astype(np.int64)
