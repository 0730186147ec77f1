"""FeatureSpec: the one description of a model's inputs.

Models read their shapes from the spec and nowhere else; decoders validate raw records
against it; serving carries it. A spec is YAML, validated on load, and every mistake is
reported with the name of the field it concerns, all of them at once.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from picasso.durations import parse_duration_ms
from picasso.kernels.hashing import hash_seed_problem
from picasso.sample_join.join_spec import parse_join
from picasso.train_choices import SPARSE_OPTIMIZERS

POOLING_MODES = ("sum", "mean")
# Which parts of a model an id feature feeds: the deep part (an embedding of embedding_dim
# for the MLP, FM or interactions), the wide part (a weight per row, summed into the logit:
# Wide&Deep's linear model, DeepFM's first order), or both. Fields feed both; a cross
# feeds the wide part unless it says otherwise.
PARTS = ("wide", "deep", "both")
DENSE_TRANSFORMS = ("identity", "log1p")


class SpecError(ValueError):
    """A FeatureSpec that cannot be used. The message lists every problem found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid feature spec:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class DenseField:
    name: str
    # log1p tames count-like features (Criteo's integer columns); applied at decode time,
    # so training and serving see the same values.
    transform: str = "identity"


WHEN_FULL = ("lfu", "refuse")


@dataclass(frozen=True)
class DynamicTable:
    """A table that grows with the ids it meets, instead of a fixed hash_buckets range.

    Each admitted id gets a row of its own (no two admitted ids ever share one: integer
    ids are their own keys, string ids their 64-bit hash; see picasso.kernels.hashing). Ids not
    admitted yet, ids evicted and ids refused for want of room share the field's one
    trainable default row. The map and its rules live in picasso.dynamic_rows.
    """

    capacity: int  # rows (a spec may give bytes of row values: "16MiB", see parse_spec)
    # Occurrences (counted in a count-min sketch, which may over-count, never under) an id
    # needs before it gets a row; 1 admits every id at once.
    admit_after: int = 1
    # Free the rows of ids no training step has seen for this many steps; None: never.
    evict_after_steps: int | None = None
    # Or in event time: free the rows of ids not seen in the last `evict_after` ("7d",
    # "12h": picasso.durations) of the stream's event time, which each batch carries
    # (PackedBatch.event_time_ms). At most one of the two.
    evict_after: str | None = None
    # A new id when every row is taken: "lfu" takes the row of the least-counted id not
    # seen in the last two steps; "refuse" leaves it on the default row until one frees.
    when_full: str = "lfu"
    # Age-based eviction never leaves fewer rows in use than this.
    keep_rows: int = 0
    # A secret in [1, 2^64) that keys the hash of the field's ids (picasso.kernels.hashing.key_of):
    # without it, whoever chooses string ids can craft two with one key, and so one row
    # (the fixed hash is public), or pile ids onto one slot of the map's index. None (the
    # default) keeps the fixed hash: the same data gives the same keys, rows and initial
    # values in every run, checkpoints made before seeds existed keep their keys, and
    # every process that decodes (workers, the stream's join, serving) agrees with no
    # more than the spec. A seed drawn at a model's creation would break the last: each
    # process parsing the spec would draw its own. The spec, and so every checkpoint and
    # published version, carries the seed: keep them as private as the weights.
    hash_seed: int | None = None

    @property
    def evict_after_ms(self) -> int | None:
        return None if self.evict_after is None else parse_duration_ms(self.evict_after)

    @property
    def evicts_by_event_time(self) -> bool:
        return self.evict_after is not None


@dataclass(frozen=True)
class SparseField:
    name: str
    embedding_dim: int
    # Exactly one of the three: hash_buckets hashes every raw id (string or integer) into
    # [0, hash_buckets); vocab_size takes integer ids as row indices and rejects the rest;
    # dynamic gives every admitted id (string or integer) a row of its own.
    hash_buckets: int | None = None
    vocab_size: int | None = None
    pooling: str = "sum"
    max_len: int = 1
    group: str | None = None
    # The sparse optimizer of this field's table (row-wise adagrad, lazy adam or sgd);
    # None takes the trainer's default. Fields only share a table with fields that agree.
    optimizer: str | None = None
    dynamic: DynamicTable | None = None
    # A feature cross (the spec's `crosses:`), whose ids the decoder computes from the ids of
    # these fields (picasso.kernels.hashing: cross); empty for a field read from the input.
    cross_of: tuple[str, ...] = ()
    part: str = "both"  # PARTS

    @property
    def num_rows(self) -> int:
        """Rows of the field's table: a dynamic field's capacity and its default row."""
        if self.dynamic is not None:
            return self.dynamic.capacity + 1
        return self.hash_buckets if self.hash_buckets is not None else self.vocab_size

    @property
    def hashed(self) -> bool:
        return self.hash_buckets is not None

    @property
    def takes_strings(self) -> bool:
        """Hashed and dynamic fields take string and integer ids; vocab fields integers."""
        return self.hash_buckets is not None or self.dynamic is not None

    @property
    def multi_hot(self) -> bool:
        return self.max_len > 1

    @property
    def is_cross(self) -> bool:
        return bool(self.cross_of)

    @property
    def deep(self) -> bool:
        return self.part != "wide"

    @property
    def wide(self) -> bool:
        return self.part != "deep"


@dataclass(frozen=True)
class FeatureSpec:
    label: str
    dense: tuple[DenseField, ...]
    sparse: tuple[SparseField, ...]  # the sparse fields the input holds
    name: str = "spec"
    # Feature crosses: id features computed from the sparse fields' ids, each with a table
    # of its own rows like a field's (SparseField.cross_of).
    crosses: tuple[SparseField, ...] = ()

    @property
    def id_features(self) -> tuple[SparseField, ...]:
        """Every feature with rows in a table: the sparse fields, then the crosses. Packing,
        the tables and everything after decoding go by these; the input holds the fields."""
        return self.sparse + self.crosses

    @property
    def dense_names(self) -> list[str]:
        return [f.name for f in self.dense]

    @property
    def sparse_names(self) -> list[str]:
        return [f.name for f in self.sparse]

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Every feature, dense then sparse (the label is not one)."""
        return (*self.dense_names, *self.sparse_names)

    @property
    def dynamic_fields(self) -> list[SparseField]:
        """The id features (fields and crosses) with dynamic tables."""
        return [f for f in self.id_features if f.dynamic is not None]

    def sparse_field(self, name: str) -> SparseField:
        """A sparse field or a cross, by name."""
        for f in self.id_features:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        def compact(obj) -> dict[str, Any]:
            defaults = {f.name: f.default for f in dataclasses.fields(obj)}
            values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return {k: compact(v) if dataclasses.is_dataclass(v) else v
                    for k, v in values.items() if k == "name" or v != defaults[k]}

        out = {
            "name": self.name,
            "label": self.label,
            "dense": [compact(f) for f in self.dense],
            "sparse": [compact(f) for f in self.sparse],
        }
        if self.crosses:  # absent otherwise: a spec without crosses reads as before them
            out["crosses"] = [_cross_dict(compact(c)) for c in self.crosses]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def _cross_dict(compacted: dict[str, Any]) -> dict[str, Any]:
    """A cross as the `crosses:` section writes it (see _parse_cross)."""
    out = {"name": compacted.pop("name"), "fields": list(compacted.pop("cross_of"))}
    part = compacted.pop("part", "both")
    if part != CROSS_PART:
        out["part"] = part
    if part == "wide":
        compacted.pop("embedding_dim", None)
    return {**out, **compacted}


# ---------------------------------------------------------------------------------------
# Parsing and validation

_TOP_KEYS = {"name", "label", "dense", "sparse", "crosses", "join"}
_DENSE_KEYS = {f.name for f in dataclasses.fields(DenseField)}
# cross_of and part are a cross's (the `crosses:` section's `fields` and `part`).
_SPARSE_KEYS = {f.name for f in dataclasses.fields(SparseField)} - {"cross_of", "part"}
_CROSS_KEYS = {"name", "fields", "hash_buckets", "dynamic", "part", "embedding_dim", "pooling", "max_len", "group",
               "optimizer"}
CROSS_PART = "wide"  # where a cross goes unless it says
_DYNAMIC_KEYS = {f.name for f in dataclasses.fields(DynamicTable)}
_VOCABULARIES = ("hash_buckets", "vocab_size", "dynamic")
_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_unknown(where: str, entry: dict, allowed: set[str], problems: list[str]) -> None:
    for key in sorted(set(entry) - allowed):
        problems.append(f"{where}: unknown key '{key}' (allowed: {', '.join(sorted(allowed))})")


def _parse_dense(i: int, entry: Any, problems: list[str]) -> DenseField | None:
    if isinstance(entry, str):  # shorthand: a bare name
        entry = {"name": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        problems.append(f"dense field #{i}: needs a 'name'")
        return None
    where = f"dense field '{entry['name']}'"
    _check_unknown(where, entry, _DENSE_KEYS, problems)
    transform = entry.get("transform", "identity")
    if transform not in DENSE_TRANSFORMS:
        problems.append(f"{where}: transform must be one of {DENSE_TRANSFORMS}, got {transform!r}")
    return DenseField(name=entry["name"], transform=transform)


def _parse_sparse(i: int, entry: Any, problems: list[str], kind: str = "sparse field",
                  keys: set[str] = _SPARSE_KEYS) -> SparseField | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        problems.append(f"{kind} #{i}: needs a 'name'")
        return None
    where = f"{kind} '{entry['name']}'"
    before = len(problems)
    _check_unknown(where, entry, keys, problems)
    hash_buckets, vocab_size = entry.get("hash_buckets"), entry.get("vocab_size")
    vocabularies = [key for key in _VOCABULARIES if key in keys]
    if sum(entry.get(key) is not None for key in vocabularies) != 1:
        quoted = [f"'{key}'" for key in vocabularies]
        problems.append(f"{where}: needs exactly one of {', '.join(quoted[:-1])} or {quoted[-1]}")
    for key in ("hash_buckets", "vocab_size"):
        if entry.get(key) is not None and not _positive_int(entry[key]):
            problems.append(f"{where}: {key} must be a positive integer, got {entry[key]!r}")
    if not _positive_int(entry.get("embedding_dim")):
        problems.append(f"{where}: embedding_dim must be a positive integer, got {entry.get('embedding_dim')!r}")
    dynamic = None
    if entry.get("dynamic") is not None:
        dynamic = _parse_dynamic(where, entry["dynamic"], entry.get("embedding_dim"), problems)
    pooling = entry.get("pooling", "sum")
    if pooling not in POOLING_MODES:
        problems.append(f"{where}: pooling must be one of {POOLING_MODES}, got {pooling!r}")
    max_len = entry.get("max_len", 1)
    if not _positive_int(max_len):
        problems.append(f"{where}: max_len must be a positive integer, got {max_len!r}")
    optimizer = entry.get("optimizer")
    if optimizer is not None and optimizer not in SPARSE_OPTIMIZERS:
        problems.append(f"{where}: optimizer must be one of {SPARSE_OPTIMIZERS}, got {optimizer!r}")
    group = entry.get("group")
    if group is not None and (not isinstance(group, str) or not group.isidentifier()):
        problems.append(f"{where}: group must be an identifier, got {group!r}")
    if len(problems) > before:
        return None
    return SparseField(
        name=entry["name"],
        embedding_dim=entry["embedding_dim"],
        hash_buckets=hash_buckets,
        vocab_size=vocab_size,
        pooling=pooling,
        max_len=max_len,
        group=group,
        optimizer=optimizer,
        dynamic=dynamic,
    )


def _parse_cross(i: int, entry: Any, sparse: dict[str, SparseField], others: dict[str, str],
                 problems: list[str]) -> SparseField | None:
    """A `crosses:` entry: `name`, the sparse `fields` it crosses (two or more, in order),
    `hash_buckets` or `dynamic`, and `part` (PARTS; CROSS_PART unless given), with
    `embedding_dim` where it feeds the deep part. Its ids: picasso.kernels.hashing (cross). `pooling`,
    `group` and `optimizer` are a field's; `max_len` caps the bag of crosses (by default
    the product of the fields' max_len: every combination kept). `others` names what is
    not a sparse field (the label, the dense fields, the crosses) for the messages."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        problems.append(f"cross #{i}: needs a 'name'")
        return None
    where = f"cross '{entry['name']}'"
    before = len(problems)
    part = entry.get("part", CROSS_PART)
    if part not in PARTS:
        problems.append(f"{where}: part must be one of {PARTS}, got {part!r}")
    elif part != "wide" and entry.get("embedding_dim") is None:
        problems.append(f"{where}: embedding_dim is needed where a cross feeds the deep part (part: {part})")
    names = entry.get("fields")
    members: list[SparseField] = []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(f"{where}: fields must be a list of sparse field names, got {names!r}")
    elif len(names) < 2:
        problems.append(f"{where}: a cross takes two or more fields, got {len(names)}")
    else:
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"{where}: field '{name}' is listed more than once")
        for name in names:
            if name in sparse:
                members.append(sparse[name])
            elif name in others:
                problems.append(f"{where}: '{name}' is {others[name]}; a cross takes sparse fields")
            else:
                problems.append(f"{where}: unknown field '{name}'")
    # A cross that feeds the wide part alone has a weight a row: its embedding_dim is 1,
    # whatever it says (so that switching a cross to `wide` needs no other edit).
    dim = entry.get("embedding_dim") if part in ("deep", "both") and entry.get("embedding_dim") is not None else 1
    cross = _parse_sparse(i, {**entry, "embedding_dim": dim, "max_len": entry.get("max_len", 1)}, problems, "cross",
                          _CROSS_KEYS)
    if cross is None or len(problems) > before:
        return None
    every = 1
    for member in members:
        every *= member.max_len
    return dataclasses.replace(cross, cross_of=tuple(names), part=part, max_len=entry.get("max_len", every))


def _parse_dynamic(where: str, raw: Any, embedding_dim: Any, problems: list[str]) -> DynamicTable | None:
    """A field's `dynamic:` mapping; `capacity` is rows, or bytes of the field's row values
    (embedding_dim float32s a row: "16MiB"), which the optimizer's slots, the wide part of
    a model and the map add to (README: dynamic tables)."""
    where = f"{where}: dynamic"
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a mapping with at least a 'capacity', got {raw!r}")
        return None
    before = len(problems)
    _check_unknown(where, raw, _DYNAMIC_KEYS, problems)
    capacity = raw.get("capacity")
    if isinstance(capacity, str) and _positive_int(embedding_dim):
        capacity = _rows_of_bytes(capacity, embedding_dim)
    if not _positive_int(capacity):
        problems.append(f"{where}: capacity must be a positive number of rows, or of bytes (\"16MiB\"), "
                        f"got {raw.get('capacity')!r}")
    settings = {"admit_after": raw.get("admit_after", 1), "keep_rows": raw.get("keep_rows", 0)}
    if not _positive_int(settings["admit_after"]):
        problems.append(f"{where}: admit_after must be a positive integer (occurrences), got {settings['admit_after']!r}")
    keep = settings["keep_rows"]
    if not (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 0):
        problems.append(f"{where}: keep_rows must be an integer >= 0, got {keep!r}")
    elif _positive_int(capacity) and keep > capacity:
        problems.append(f"{where}: keep_rows {keep} is more than the capacity of {capacity} rows")
    evict = raw.get("evict_after_steps")
    if evict is not None and not _positive_int(evict):
        problems.append(f"{where}: evict_after_steps must be a positive integer (steps) or absent, got {evict!r}")
    evict_after = raw.get("evict_after")
    if evict_after is not None:
        try:
            if parse_duration_ms(evict_after) <= 0:
                problems.append(f"{where}: evict_after must be a positive duration, got {evict_after!r}")
        except ValueError as error:
            problems.append(f"{where}: evict_after: {error}")
        if evict is not None:
            problems.append(f"{where}: give evict_after_steps (steps) or evict_after (event time), not both")
    when_full = raw.get("when_full", "lfu")
    if when_full not in WHEN_FULL:
        problems.append(f"{where}: when_full must be one of {WHEN_FULL}, got {when_full!r}")
    hash_seed = raw.get("hash_seed")
    if hash_seed is not None and (problem := hash_seed_problem(hash_seed)):
        problems.append(f"{where}: {problem} (draw one: python -c 'import secrets; print(secrets.randbits(64))')")
    if len(problems) > before:
        return None
    return DynamicTable(capacity=capacity, evict_after_steps=evict, evict_after=evict_after, when_full=when_full,
                        hash_seed=hash_seed, **settings)


def _rows_of_bytes(text: str, embedding_dim: int) -> int | None:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)\s*", text.lower())
    if not match:
        return None
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2)]) // (4 * embedding_dim) or None


def parse_spec(raw: Any) -> FeatureSpec:
    """Build a FeatureSpec from parsed YAML, or raise SpecError listing every problem."""
    if not isinstance(raw, dict):
        raise SpecError([f"a spec must be a mapping, got {type(raw).__name__}"])
    problems: list[str] = []
    _check_unknown("spec", raw, _TOP_KEYS, problems)
    label = raw.get("label")
    if not isinstance(label, str) or not label:
        problems.append("spec: missing 'label' (the name of the click column)")
    # An absent or empty (null) list is no fields; anything else must be a list.
    dense_raw, sparse_raw = (raw.get(key) if raw.get(key) is not None else [] for key in ("dense", "sparse"))
    for key, value in (("dense", dense_raw), ("sparse", sparse_raw)):
        if not isinstance(value, list):
            problems.append(f"spec: '{key}' must be a list of fields")
    dense = [_parse_dense(i, e, problems) for i, e in enumerate(dense_raw if isinstance(dense_raw, list) else [])]
    sparse = [_parse_sparse(i, e, problems) for i, e in enumerate(sparse_raw if isinstance(sparse_raw, list) else [])]
    if isinstance(sparse_raw, list) and not sparse_raw:
        problems.append("spec: needs at least one sparse field")
    crosses_raw = raw.get("crosses") if raw.get("crosses") is not None else []
    if not isinstance(crosses_raw, list):
        problems.append("spec: 'crosses' must be a list of crosses")
        crosses_raw = []
    others = {label: "the label"} if isinstance(label, str) else {}
    others.update({f.name: "a dense field" for f in dense if f is not None})
    by_name = {f.name: f for f in sparse if f is not None}
    cross_names = {c["name"] for c in crosses_raw if isinstance(c, dict) and isinstance(c.get("name"), str)}
    crosses = [_parse_cross(i, e, by_name, {name: "a cross" for name in cross_names} | others, problems)
               for i, e in enumerate(crosses_raw)]
    parse_join(raw.get("join"), problems)  # kept apart from the FeatureSpec: see picasso.sample_join.join_spec

    seen: set[str] = set()
    names = ([label] if isinstance(label, str) else []) + [f.name for f in dense + sparse if f is not None]
    for name in names:
        if name in seen:
            problems.append(f"field '{name}': duplicate name")
        seen.add(name)
    for entry in crosses_raw:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name in seen:
            taken = others.get(name, "a sparse field") if name in names else "another cross"
            problems.append(f"cross '{name}': its name is taken by {taken}")
        seen.add(name)
    if problems:
        raise SpecError(problems)
    return FeatureSpec(label=label, dense=tuple(dense), sparse=tuple(sparse), name=str(raw.get("name", "spec")),
                       crosses=tuple(crosses))


def spec_differences(saved: FeatureSpec, wanted: FeatureSpec, most: int = 4) -> str:
    """What differs between a model's spec (saved) and this run's (wanted), in words, for a
    refusal ("id feature C9: embedding_dim 16 in this run, 8 in the model; id features only
    in the model: C27"): the name alone says nothing when both are called `criteo`."""
    found = []
    if saved.label != wanted.label:
        found.append(f"label {wanted.label!r} in this run, {saved.label!r} in the model")
    for kind, here, there in (("dense field", wanted.dense, saved.dense),
                              ("id feature", wanted.id_features, saved.id_features)):
        mine, theirs = {f.name: f for f in here}, {f.name: f for f in there}
        if only := [name for name in theirs if name not in mine]:
            found.append(f"{kind}s only in the model: {', '.join(only[:most])}{' ...' if len(only) > most else ''}")
        if only := [name for name in mine if name not in theirs]:
            found.append(f"{kind}s only in this run: {', '.join(only[:most])}{' ...' if len(only) > most else ''}")
        for name in (n for n in mine if n in theirs and mine[n] != theirs[n]):
            a, b = asdict(mine[name]), asdict(theirs[name])
            changed = [f"{key} {a[key]!r} in this run, {b[key]!r} in the model" for key in a if a[key] != b.get(key)]
            found.append(f"{kind} {name}: {'; '.join(changed)}")
    if not found and [f.name for f in saved.id_features] != [f.name for f in wanted.id_features]:
        found.append("the id features are in another order")
    if not found:
        found.append(f"spec name {wanted.name!r} in this run, {saved.name!r} in the model")
    return "; ".join(found[:most]) + (f"; and {len(found) - most} more" if len(found) > most else "")
