"""The hot-row cache in front of the parameter server: a GBA worker's pulls of hot rows,
served from a local copy that is never more than a few global steps old.

A worker pulls every distinct row its batch touches. Under a Zipf load most of those are
the same few hot rows batch after batch, and each pull carries them again. `CachedPSClient`
wraps the worker's PSClient and keeps, per table, the hottest rows (chosen by the same
HotRowDirectory as the trainer's hot-row cache: decayed counts, exact for cached rows, a
sketch for the tail, admissions every `refresh_every` steps) with the value, version and
token each was pulled at. A pull then asks the shards only for:
- rows that are not cached, or were admitted since their last pull (no value yet);
- cached rows pulled more than `max_staleness` global steps before the token the row's
  shard answers this pull with (checked against the expected token before the call, and
  against the real one after it: a row the model moved past meanwhile is pulled again at
  once). That is the refresh within the staleness bound.
A row served locally goes into the push with the version it was pulled at, so the shard
weighs its gradient by the row's true staleness (gba.py), exactly as it weighs a row from
a slow worker: the cache trades freshness the GBA decay already accounts for against PS
traffic. With `max_staleness=0` only rows the model has not moved past are served (M > 1
local batches share a global step): training is then exactly what it is without the cache.

The dense parameters are always pulled: they change at every global step.
`stats` counts what the cache saved: rows and bytes the shards did not send.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from picasso.cache import counter_metrics, parse_capacity
from picasso.distributed.local_gradient import LocalGradient
from picasso.distributed.ps_client import PSClient, PulledBatch
from picasso.hot_rows import HotRowDirectory

_VERSION_BYTES = 8  # a pulled row also carries its int64 version


@dataclass(frozen=True)
class RowCacheConfig:
    # Rows kept per table: rows ("50000"), bytes ("64MiB") or a share of the table ("10%").
    capacity: str = "10%"
    # Global steps a served row may lag the newest token seen from its shard. Within the
    # GBA decay's full-weight window (GBAConfig.tau_max) it costs no gradient weight.
    max_staleness: int = 2
    refresh_every: int = 100  # steps between admissions/evictions
    half_life: float = 2000.0  # steps for a row's access count to halve

    def __post_init__(self):
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")


@dataclass
class RowCacheStats:
    rows_asked: int = 0  # distinct rows the worker's batches needed, summed over pulls
    rows_served: int = 0  # of those, served from the cache: PS traffic saved
    bytes_saved: int = 0  # values and versions the shards did not send

    @property
    def served_share(self) -> float:
        return self.rows_served / self.rows_asked if self.rows_asked else float("nan")

    def as_metrics(self) -> dict[str, float]:
        return counter_metrics(self, served_share=self.served_share)


@dataclass
class _CachedTable:
    directory: HotRowDirectory  # shared by the tables over the same rows
    values: torch.Tensor  # (capacity, dim), per slot
    versions: torch.Tensor  # (capacity,) the row's version when pulled
    pulled_at: torch.Tensor  # (capacity,) the token of its shard then; -1: no value yet
    row_bytes: int = 0  # a row's values and its version, as pulled


class CachedPSClient:
    """A PSClient with the hot-row cache in front of its pulls; pushes pass straight through."""

    def __init__(self, client: PSClient, config: RowCacheConfig = RowCacheConfig(), seed: int = 0):
        self.client = client
        self.config = config
        self.tables: dict[str, _CachedTable] = {}
        # Tables over the same rows (Wide&Deep's deep and wide tables of one packed group)
        # are pulled for the same ids: they share one directory, which counts each id once.
        # A capacity in bytes counts a row of every table that shares it.
        sharing: dict[tuple[str, int], list] = {}
        for table in client.layout.tables:
            sharing.setdefault((table.key.rsplit(".", 1)[-1], table.num_rows), []).append(table)
        for i, ((_, num_rows), tables) in enumerate(sharing.items()):
            capacity = parse_capacity(config.capacity, num_rows, sum(t.dim * 4 + _VERSION_BYTES for t in tables))
            directory = HotRowDirectory(num_rows, capacity, config.refresh_every, config.half_life, seed=seed + i)
            for table in tables:
                self.tables[table.key] = _CachedTable(
                    directory, torch.zeros(capacity, table.dim), torch.zeros(capacity, dtype=torch.int64),
                    torch.full((capacity,), -1, dtype=torch.int64), table.dim * 4 + _VERSION_BYTES)
        # The newest token each shard has answered with: how far the model has moved on.
        self.newest = torch.full((client.layout.num_shards,), -1, dtype=torch.int64)
        # How far the tokens moved between the last two pulls: the guess for the next.
        self.advance = torch.zeros(client.layout.num_shards, dtype=torch.int64)
        self.stats = RowCacheStats()

    @property
    def worker(self) -> str:
        return self.client.worker

    @property
    def outcomes(self):
        return self.client.outcomes

    def pull(self, rows: dict[str, torch.Tensor]) -> PulledBatch:
        """The rows' values and versions (and the dense parameters), as PSClient.pull
        returns them; fresh cached rows come from here, the rest from the shards.

        Freshness is judged twice. Before the pull, against the token the shards are
        expected to be at (the newest seen plus the last advance between pulls), to choose
        what to ask for; after it, against the tokens they answered with. A cached row the
        model moved past meanwhile is pulled in a second call, so no row is ever served
        more than max_staleness steps behind the tokens this pull pushes back."""
        slots, owners, pulled_at, observed = {}, {}, {}, set()
        for key, wanted in rows.items():
            table = self.tables[key]
            slot = slots[key] = table.directory.slot_of_row[wanted].to(torch.int64)
            owners[key] = self.client.layout.owner(wanted)
            hot = slot >= 0
            if id(table.directory) not in observed:  # once per directory (tables may share one)
                observed.add(id(table.directory))
                ones = torch.ones_like(wanted)
                table.directory.observe(wanted[~hot], ones[~hot], slot[hot], ones[hot])
            # When each cached row was pulled (its shard's token); -1: not cached, or no value yet.
            pulled_at[key] = torch.where(hot, table.pulled_at[slot.clamp(min=0)], torch.full_like(slot, -1))

        def fresh(key: str, now: torch.Tensor) -> torch.Tensor:
            """Cached with a value at most max_staleness steps behind `now` (a token per shard)."""
            return (pulled_at[key] >= 0) & (pulled_at[key] >= now[owners[key]] - self.config.max_staleness)

        served = {key: fresh(key, self.newest + self.advance) for key in rows}
        answer = self.client.pull({key: wanted[~served[key]] for key, wanted in rows.items()})
        tokens = torch.tensor(answer.tokens, dtype=torch.int64)
        late = {key: served[key] & ~fresh(key, tokens) for key in rows}
        again = self.client.pull({key: wanted[late[key]] for key, wanted in rows.items()}) \
            if any(mask.any() for mask in late.values()) else None
        values, versions = {}, {}
        for key, wanted in rows.items():
            table, slot = self.tables[key], slots[key]
            local = served[key] & ~late[key]
            values[key] = torch.empty(wanted.numel(), table.values.shape[1])
            versions[key] = torch.empty(wanted.numel(), dtype=torch.int64)
            values[key][local], versions[key][local] = table.values[slot[local]], table.versions[slot[local]]
            values[key][~served[key]], versions[key][~served[key]] = answer.values[key], answer.versions[key]
            if again is not None:
                values[key][late[key]], versions[key][late[key]] = again.values[key], again.versions[key]
            # Keep what the shards just sent of the cached rows.
            fetched = ~local & (slot >= 0)
            table.values[slot[fetched]] = values[key][fetched]
            table.versions[slot[fetched]] = versions[key][fetched]
            table.pulled_at[slot[fetched]] = tokens[owners[key][fetched]]
            count = int(local.sum())
            self.stats.rows_asked += wanted.numel()
            self.stats.rows_served += count
            self.stats.bytes_saved += count * table.row_bytes
        self.advance = (tokens - self.newest).clamp(min=0) if bool((self.newest >= 0).all()) else self.advance
        self.newest = torch.maximum(self.newest, tokens)
        self._refresh()
        return PulledBatch(answer.tokens, answer.dense, rows, values, versions, answer.stop)

    def _refresh(self) -> None:
        """Admissions and evictions, when due: an admitted row has no value until its next pull."""
        directories = {id(t.directory): t.directory for t in self.tables.values()}
        for directory in directories.values():
            if directory.refresh_due:
                admitted = directory.plan_refresh().admit_slots
                for table in self.tables.values():
                    if table.directory is directory:
                        table.pulled_at[admitted] = -1

    def push(self, pulled: PulledBatch, gradient: LocalGradient, positions: dict[str, int] | None = None,
             ranges: dict[str, tuple[int, int]] | None = None, labels: torch.Tensor | None = None,
             event_time_ms: int | None = None) -> None:
        self.client.push(pulled, gradient, positions, ranges, labels, event_time_ms)

    def rejoin(self) -> None:
        # Cached rows stay: each carries the version it was pulled at, which the shards judge.
        self.client.rejoin()

    def renew(self) -> None:
        self.client.renew()

    def positions(self) -> dict[str, int]:
        return self.client.positions()

    def collect(self) -> None:
        self.client.collect()

    def drain(self) -> None:
        self.client.drain()

    def finish(self) -> None:
        self.client.finish()
