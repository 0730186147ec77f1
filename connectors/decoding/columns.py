"""Column helpers that parsing and validation share: one Arrow array per column where its
values have a single Arrow type, null masks, and how a refused value is named."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError, ValueError)


def as_arrow_array(values) -> pa.Array | None:
    """An Arrow array for a column, or None when its values have no single Arrow type."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        return values
    try:
        arr = pa.array(values)
    except ARROW_ERRORS:
        return None
    # After a float, Arrow reads True as 1.0; booleans must reach the validator as such.
    if pa.types.is_floating(arr.type) and any(isinstance(v, bool) for v in values):
        return None
    return arr


def null_mask(values, n: int) -> np.ndarray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if values.null_count == 0:
            return np.zeros(n, dtype=bool)
        return values.is_null().to_numpy(zero_copy_only=False)
    return np.array([v is None for v in values], dtype=bool)


def has_negative(ids: pa.Array) -> bool:
    return pa.types.is_signed_integer(ids.type) and len(ids) > 0 and pc.min(ids).as_py() < 0


def describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}"
