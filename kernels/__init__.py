"""Fused embedding ops behind one dispatch.

Three ops over a packed table (see reference.py for their exact definition):
- `lookup`: pool every (sample, field) bag in one call;
- `fused_update`: the backward pass of lookup fused with a sparse optimizer step;
- `row_gradients`: that backward pass returning each row's gradient instead of stepping,
  for a compact table of the rows a batch touches (a GBA worker's pulled rows);
- `lookup_many`, `fused_update_many`: lookup and fused_update of several tables over the
  same rows, ids and offsets (Wide&Deep's deep and wide tables) in one call each; a
  backend without them calls its one-table ops table by table (reference.lookup_each).
Four for the hot-row cache's bookkeeping, which lives on the host:
- `map_to_slots`: de-duplicate a batch's ids and map them to fast-tier indices;
- `positions_in`: which of a batch's rows are among others (rows still in flight);
- `copy_rows`: move rows between tiers;
- `sketch_add`: a conservative count-min sketch update.
For a dynamic table's id -> row map, also on the host (see id_map_reference.py):
- `id_map_find`: the rows of a batch's keys, stamping the rows found, and its misses;
- `id_map_admit`: rows for new keys, free rows first, then LFU victims;
- `id_map_expire`: free the rows not seen for a while;
- `id_map_resolve`: all of the above as one training batch of one field uses them;
- `id_map_rebuild`: the map's index again from its rows' keys;
- `id_map_initial_rows`: the first values of the rows new keys take; `id_map_reset_rows`
  writes them into a table and zeroes their slots.
And two for the decoder, on the host (see id_columns.py, decode_ids_reference.py and
cross_ids_reference.py):
- `decode_ids`: every id column of a batch (Arrow arrays) hashed, bucketed and checked;
- `cross_ids`: the feature crosses' bags, from decoded columns of their fields' keys.
And one for packing, on the host (see group_ids.py, pack_groups_reference.py):
- `pack_group`: a packing group's ids and bag starts from its fields' columns (Arrow arrays).
And one for both, on the host, C++ only (see fused_batch.py; its definition is the
decoder's reference path followed by picasso.batch.pack, connectors.decoding.packed_decode):
- `decode_pack`: a raw Arrow record batch decoded, checked and packed in one call.
And the sample join's index of its records (csrc/key_index.cpp), which picasso.key_index
reaches through host_backend(); without the C++ backend it is a dict, its definition.

Backends, chosen per device at run time:
- "reference": plain torch, the definition; runs anywhere;
- "cpu": a C++ kernel multi-threaded with OpenMP, built with torch.utils.cpp_extension
  on first use and cached (the default on CPU);
- "triton": Triton GPU kernels (the default on CUDA when triton is installed).
PICASSO_KERNELS=reference|cpu|triton forces one.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

import torch

from picasso.kernels.reference import OPTIMIZERS, SparseOptimizer, fused_update_each, lookup_each

log = logging.getLogger(__name__)

BACKENDS = ("reference", "cpu", "triton")
_MODULES = {"reference": "picasso.kernels.reference", "cpu": "picasso.kernels.cpu", "triton": "picasso.kernels.triton_kernels"}
_loaded: dict[str, ModuleType | None] = {}


def load_backend(name: str) -> ModuleType:
    """The module of a backend; raises if it cannot be loaded here."""
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose one of {BACKENDS}")
    return importlib.import_module(_MODULES[name])


def _try(name: str) -> ModuleType | None:
    if name not in _loaded:
        try:
            _loaded[name] = load_backend(name)
        except Exception as err:  # a missing compiler or package: fall back, and say so
            log.warning("kernel backend %r unavailable (%s); using the reference kernels", name, err)
            _loaded[name] = None
    return _loaded[name]


def backend_for(device: torch.device) -> ModuleType:
    forced = os.environ.get("PICASSO_KERNELS")
    if forced:
        return load_backend(forced)
    preferred = "triton" if device.type == "cuda" else "cpu" if device.type == "cpu" else "reference"
    return _try(preferred) or load_backend("reference")


def lookup(weight, ids, offsets, num_fields, mean_pooled=None, max_len=None):
    return backend_for(weight.device).lookup(weight, ids, offsets, num_fields, mean_pooled, max_len)


def fused_update(weight, slots, ids, offsets, grad, num_fields, optimizer, step, mean_pooled=None, max_len=None,
                 field_rows=None, disjoint_fields=False):
    return backend_for(weight.device).fused_update(
        weight, slots, ids, offsets, grad, num_fields, optimizer, step, mean_pooled, max_len, field_rows,
        disjoint_fields,
    )


def lookup_many(weights, ids, offsets, num_fields, mean_pooled=None, max_len=None, into=None):
    """into: per table, None or a (samples, fields, dim) view to hold its pooled bags, such
    as some columns of a model's flat input; the C++ kernels write there in place, the
    other backends copy there."""
    backend = backend_for(weights[0].device)
    if into is not None and getattr(backend, "WRITES_INTO", False):
        return backend.lookup_many(weights, ids, offsets, num_fields, mean_pooled, max_len, into)
    many = getattr(backend, "lookup_many", None) or lookup_each(backend.lookup)
    outs = many(weights, ids, offsets, num_fields, mean_pooled, max_len)
    if into is None:
        return outs
    return [out if view is None else view.copy_(out) for out, view in zip(outs, into, strict=True)]


def fused_update_many(weights, slots, ids, offsets, grads, num_fields, optimizers, steps, mean_pooled=None,
                      max_len=None, field_rows=None, disjoint_fields=False):
    backend = backend_for(weights[0].device)
    many = getattr(backend, "fused_update_many", None) or fused_update_each(backend.fused_update)
    return many(weights, slots, ids, offsets, grads, num_fields, optimizers, steps, mean_pooled, max_len, field_rows,
                disjoint_fields)


def row_gradients(num_rows, dim, ids, offsets, grad, num_fields, mean_pooled=None, max_len=None, field_rows=None,
                  disjoint_fields=False):
    return backend_for(grad.device).row_gradients(
        num_rows, dim, ids, offsets, grad, num_fields, mean_pooled, max_len, field_rows, disjoint_fields,
    )


# The id map's reference ops live in id_map_reference.py, without this prefix.
_ID_MAP = "id_map_"


def host_backend() -> ModuleType | None:
    """The C++ backend for host ops, or None where they run as the reference (no compiler,
    or PICASSO_KERNELS names another backend)."""
    return _try("cpu") if os.environ.get("PICASSO_KERNELS", "cpu") == "cpu" else None


def _host_op(name: str):
    """The host ops (the cache's, the id map's): the CPU backend's, else the reference."""
    backend = host_backend()
    if backend is not None:
        return getattr(backend, name)
    if name.startswith(_ID_MAP):
        return getattr(importlib.import_module("picasso.kernels.id_map_reference"), name.removeprefix(_ID_MAP))
    if name == "decode_ids":
        return importlib.import_module("picasso.kernels.decode_ids_reference").decode_ids
    if name == "pack_group":
        return importlib.import_module("picasso.kernels.pack_groups_reference").pack_group
    if name == "cross_ids":
        return importlib.import_module("picasso.kernels.cross_ids_reference").cross_ids
    return getattr(load_backend("reference"), name)


def decode_ids(columns, rules, num_rows):
    """A batch's id columns (Arrow arrays) hashed, bucketed and checked in one call: see
    id_columns.py for the contract, decode_ids_reference.py for the definition."""
    return _host_op("decode_ids")(columns, rules, num_rows)


def cross_ids(ids, offsets, starts, rules, num_rows):
    """Feature crosses' bags from decoded columns of their fields' keys: see id_columns.py
    for the contract, cross_ids_reference.py for the definition."""
    return _host_op("cross_ids")(ids, offsets, starts, rules, num_rows)


def pack_group(columns, id_offsets, num_rows):
    """A packing group's ids, sample-major, and its bag starts from its fields' columns
    (Arrow list arrays) in one call: see group_ids.py for the contract,
    pack_groups_reference.py for the definition."""
    return _host_op("pack_group")(columns, id_offsets, num_rows)


def decode_pack(plan, batch):
    """A raw Arrow record batch decoded, checked and packed in one call (see fused_batch.py);
    None where the C++ backend is not built here or the op declines the batch: the caller
    then takes the reference path, which is the definition."""
    backend = host_backend()
    return backend.decode_pack(plan, batch) if backend is not None else None


def map_to_slots(ids, slot_of_row, capacity):
    return _host_op("map_to_slots")(ids, slot_of_row, capacity)


def positions_in(rows, among, num_rows):
    return _host_op("positions_in")(rows, among, num_rows)


def copy_rows(dst, dst_index, src, src_index):
    """Between host tensors, the host op; else torch's, across the bus."""
    if dst.device.type == "cpu" and src.device.type == "cpu":
        return _host_op("copy_rows")(dst, dst_index, src, src_index)
    return load_backend("reference").copy_rows(dst, dst_index, src, src_index)


def sketch_add(counters, rows, counts, multipliers, bits):
    return _host_op("sketch_add")(counters, rows, counts, multipliers, bits)


def id_map_find(index, row_keys, last_seen, counts, keys, batch, update):
    return _host_op("id_map_find")(index, row_keys, last_seen, counts, keys, batch, update)


def id_map_admit(index, row_keys, last_seen, counts, free_rows, free_count, keys, key_counts, batch, lfu,
                 protect_since):
    return _host_op("id_map_admit")(index, row_keys, last_seen, counts, free_rows, free_count, keys, key_counts,
                                    batch, lfu, protect_since)


def id_map_expire(index, row_keys, last_seen, counts, free_rows, free_count, older_than, keep):
    return _host_op("id_map_expire")(index, row_keys, last_seen, counts, free_rows, free_count, older_than, keep)


def id_map_resolve(index, row_keys, last_seen, counts, free_rows, free_count, keys, now, expire_rows, older_than, keep,
                   lfu, protect_since, default_row, sketch_counters, sketch_multipliers, sketch_bits, sketch_added,
                   sketch_window, admit_after):
    return _host_op("id_map_resolve")(index, row_keys, last_seen, counts, free_rows, free_count, keys, now,
                                      expire_rows, older_than, keep, lfu, protect_since, default_row, sketch_counters,
                                      sketch_multipliers, sketch_bits, sketch_added, sketch_window, admit_after)


def id_map_rebuild(index, row_keys):
    return _host_op("id_map_rebuild")(index, row_keys)


def id_map_initial_rows(keys, width, scale):
    return _host_op("id_map_initial_rows")(keys, width, scale)


def id_map_reset_rows(weight, slots, targets, keys, scale):
    """New keys' first values at rows `targets` of a host table, and those rows of its slots
    zeroed; a table on another device: the reference, which indexes there."""
    if weight.device.type != "cpu":
        return importlib.import_module("picasso.kernels.id_map_reference").reset_rows(
            weight, slots, targets.to(weight.device), keys, scale)
    return _host_op("id_map_reset_rows")(weight, slots, targets, keys, scale)


__all__ = ["BACKENDS", "OPTIMIZERS", "SparseOptimizer", "backend_for", "copy_rows", "cross_ids", "decode_ids",
           "decode_pack", "fused_update", "fused_update_many", "host_backend", "id_map_admit", "id_map_expire",
           "id_map_find", "id_map_initial_rows", "id_map_rebuild", "id_map_reset_rows", "id_map_resolve", "load_backend",
           "lookup", "lookup_many", "map_to_slots", "pack_group", "positions_in", "row_gradients", "sketch_add"]
