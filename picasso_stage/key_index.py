"""KeyIndex: int64 keys to int64 values, a whole array of keys per call. The sample join
indexes its records by it (key hash -> slot of the record).

At a million pending impressions a Python dict cost about a third of the join's time: a
lookup, an insert and a delete per event through the interpreter, and an int object for
every key and value. With the C++ kernels (kernels/csrc/key_index.cpp) the index is an
open-addressing table in one int64 tensor, probed a batch at a time without the GIL, at
most half full and 16 bytes a slot. Without them (no compiler; PICASSO_KERNELS=reference)
it is a dict behind the same methods, which the tests hold the kernel one to, call for
call.

The methods take numpy int64 arrays, and change the index key by key in the order given,
so a key given twice in one call behaves as in two calls.
"""

from __future__ import annotations

import numpy as np
import torch

from picasso import kernels
from picasso.kernels.id_map_reference import EMPTY_KEY, slots_for

_SHRINK_BELOW = 8  # a table this many times emptier than half full halves (down to _MIN_SLOTS)
_MIN_SLOTS = 1024


class KeyIndex:
    """Each key held maps to one value. Use KeyIndex.new()."""

    @staticmethod
    def new() -> "KeyIndex":
        ops = kernels.host_backend()
        return _TableIndex(ops.key_index) if ops is not None else _DictIndex()

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Each key's value, -1 where not held."""
        raise NotImplementedError

    def add(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Hold each key not held yet, with its value; per key, whether it was held already
        (its value then stays)."""
        raise NotImplementedError

    def assign(self, keys: np.ndarray, values: np.ndarray) -> None:
        """New values for keys held (KeyError for one that is not)."""
        raise NotImplementedError

    def remove(self, keys: np.ndarray) -> None:
        """Let go of keys held (KeyError for one that is not)."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """What the index takes in memory."""
        raise NotImplementedError


class _DictIndex(KeyIndex):
    """The plain one, and the definition the table is held to."""

    def __init__(self):
        self._values: dict[int, int] = {}

    def get(self, keys):
        keys = _int64(keys)
        get = self._values.get
        return np.fromiter((get(key, -1) for key in keys.tolist()), np.int64, len(keys))

    def add(self, keys, values):
        keys = _int64(keys)
        held = np.zeros(len(keys), bool)
        for i, (key, value) in enumerate(zip(keys.tolist(), values.tolist())):
            if key in self._values:
                held[i] = True
            else:
                self._values[key] = value
        return held

    def assign(self, keys, values):
        keys = _int64(keys)
        missing = [key for key in keys.tolist() if key not in self._values]
        if missing:
            raise KeyError(f"key index: key {missing[0]} is not held")
        self._values.update(zip(keys.tolist(), values.tolist()))

    def remove(self, keys):
        for key in _int64(keys).tolist():
            if key not in self._values:
                raise KeyError(f"key index: key {key} is not held")
            del self._values[key]

    def __len__(self):
        return len(self._values)

    @property
    def nbytes(self):
        # A dict's table (about 3 words per entry at its usual fill) and an int object
        # for each key and value (36 and 28 bytes at these magnitudes).
        return len(self._values) * (36 + 28 + 3 * 8 * 3 // 2)


class _TableIndex(KeyIndex):
    """The kernel's open-addressing table. EMPTY_KEY, which marks its empty slots, is held
    beside it."""

    def __init__(self, ops):
        self._ops = ops
        self._table = _empty_table(_MIN_SLOTS)
        self._size = 0
        self._empty_key_value: int | None = None  # EMPTY_KEY's value, when held

    def __getstate__(self):
        # The kernels' module does not pickle: a copy takes this process's again.
        return {name: value for name, value in self.__dict__.items() if name != "_ops"}

    def __setstate__(self, state):
        self.__dict__.update(state, _ops=kernels.host_backend().key_index)

    def get(self, keys):
        keys = _int64(keys)
        values = self._ops.find(self._table, _tensor(keys)).numpy()
        if self._empty_key_value is not None:
            values[keys == EMPTY_KEY] = self._empty_key_value
        return values

    def add(self, keys, values):
        keys, values = _int64(keys), _int64(values)
        empty = keys == EMPTY_KEY
        if empty.any():
            return self._add_with_empty_key(keys, values, empty)
        self._fit(self._size + len(keys))
        held = self._ops.add(self._table, _tensor(keys), _tensor(values)).numpy()
        self._size += len(keys) - int(np.count_nonzero(held))
        return held

    def _add_with_empty_key(self, keys, values, empty):
        held = np.zeros(len(keys), bool)
        held[~empty] = self.add(keys[~empty], values[~empty])
        first = int(np.flatnonzero(empty)[0])
        held[empty] = True
        if self._empty_key_value is None:
            self._empty_key_value = int(values[first])
            held[first] = False
        return held

    def assign(self, keys, values):
        keys, values = _int64(keys), _int64(values)
        empty = keys == EMPTY_KEY
        if empty.any():
            if self._empty_key_value is None:
                raise KeyError(f"key index: key {EMPTY_KEY} is not held")
            self._empty_key_value = int(values[np.flatnonzero(empty)[-1]])
            keys, values = keys[~empty], values[~empty]
        try:
            self._ops.assign(self._table, _tensor(keys), _tensor(values))
        except RuntimeError as err:
            raise KeyError(str(err)) from None

    def remove(self, keys):
        keys = _int64(keys)
        empty = keys == EMPTY_KEY
        if empty.any():
            if self._empty_key_value is None or np.count_nonzero(empty) > 1:
                raise KeyError(f"key index: key {EMPTY_KEY} is not held")
            self._empty_key_value = None
            keys = keys[~empty]
        try:
            self._ops.remove(self._table, _tensor(keys))
        except RuntimeError as err:  # the keys before the one not held are gone: count them
            self._size = int((self._table[:, 0] != EMPTY_KEY).sum())
            raise KeyError(str(err)) from None
        self._size -= len(keys)
        if self._size * 2 * _SHRINK_BELOW < len(self._table) and len(self._table) > _MIN_SLOTS:
            self._rehash(max(_MIN_SLOTS, slots_for(self._size)))

    def __len__(self):
        return self._size + (self._empty_key_value is not None)

    @property
    def nbytes(self):
        return self._table.numel() * self._table.element_size()

    def _fit(self, size: int) -> None:
        """Room for `size` keys with the table at most half full."""
        if 2 * size > len(self._table):
            self._rehash(slots_for(size))

    def _rehash(self, slots: int) -> None:
        table = _empty_table(slots)
        self._ops.rehash(table, self._table)
        self._table = table


def _empty_table(slots: int) -> torch.Tensor:
    table = torch.empty((slots, 2), dtype=torch.int64)
    table[:, 0], table[:, 1] = EMPTY_KEY, -1
    return table


def _int64(array: np.ndarray) -> np.ndarray:
    """Keys as int64: unsigned ones (the join's hashes) bit for bit."""
    array = np.ascontiguousarray(array)
    return array.view(np.int64) if array.dtype == np.uint64 else array.astype(np.int64, copy=False)


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(_int64(array))
