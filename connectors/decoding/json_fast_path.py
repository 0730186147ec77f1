"""Arrow's JSON reader over a whole poll, used only where it gives json.loads' verdicts.

The values of a poll, joined into newline-delimited JSON, are parsed by Arrow's C++
reader in one call: about 3x cheaper than json.loads per message. Whenever the reader
cannot vouch for every message, read_poll returns None and the poll takes the
per-message path (RecordDecoder.decode_json), which names each bad message:
- a message that does not begin with `{` and end with `}` (see below);
- anything Arrow's reader refuses: invalid JSON, a duplicate key, a column whose type
  changes between messages;
- text json.loads refuses but Arrow's reader takes (`-NaN`, bytes that are not UTF-8);
- a column Arrow typed lossily (see _typed_as_json).

The reader is given the column types of the last poll it vouched for, per decoder: a
producer's events keep their types, and a reader told them skips inferring them again.
With types given, Arrow refuses any value that does not fit the type (a float in an
integer column, a number in a string one) rather than converting it, so such a poll is
read again with the types inferred, and then decided as above.

Why first and last bytes: the poll is one block, which the reader parses as a sequence
of JSON values where a newline is only whitespace, so it sees no message boundaries.
Were messages free-form, `{"a":` + `{"b": 1}}` + `{"c": 1}{"c": 2}` would give three rows
from three bad messages. When every message begins with `{` and ends with `}`, no value
can run on into the next message: after a `}` the only tokens that continue an open value
are `,`, `}` and `]`, never the `{` that follows, and a string cannot hold the newline
between them (a raw control character is invalid JSON, to both readers). So each message gives one row or more,
and a poll of as many rows as messages has exactly one per message. Leading blanks are
refused for a second reason: pyarrow 25's reader takes a `null` as a row, and a poll that
begins with one crashes the process (a segmentation fault).
"""

from __future__ import annotations

import io
import weakref
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.json as pa_json

from picasso.connectors.decoding.record_decoder import RecordDecoder

_OPEN, _CLOSE = ord("{"), ord("}")
_ARROW_REFUSES = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)

# Per decoder: the known columns of the last poll read here whole, typed as json.loads
# would read them, and their names. Weak, so that a decoder's end frees its entry.
_learned: weakref.WeakKeyDictionary[RecordDecoder, tuple[pa.Schema, frozenset[str]]] = weakref.WeakKeyDictionary()


def read_poll(decoder: RecordDecoder, values: Sequence[bytes]) -> pa.Table | None:
    """The poll as one table with a row per value, or None where the per-message path
    must decide."""
    if not values or not all(value and value[0] == _OPEN and value[-1] == _CLOSE for value in values):
        return None
    data = b"\n".join(values)
    # ASCII, the usual case, is checked at memory speed.
    if not (data.isascii() or _is_utf8(data)) or not _no_minus_nan(data):
        return None
    if decoder in _learned:
        types, names = _learned[decoder]
        table = _read(data, types)
        if table is not None and table.num_rows == len(values) and _typed_as_json(table, decoder, names):
            return table
    table = _read(data, None)
    if table is None or table.num_rows != len(values) or not _typed_as_json(table, decoder, frozenset()):
        return None
    types = _types_to_give(table, decoder)
    _learned[decoder] = types, frozenset(types.names)
    return table


def _read(data: bytes, types: pa.Schema | None) -> pa.Table | None:
    try:
        return pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
            # Fields outside `types` (unknown ones, or known ones the last poll lacked)
            # are inferred as without it.
            parse_options=pa_json.ParseOptions(explicit_schema=types) if types is not None else None,
        )
    except _ARROW_REFUSES:
        return None


def _types_to_give(table: pa.Table, decoder: RecordDecoder) -> pa.Schema:
    """The known columns of a table _typed_as_json vouched for, with the types inferred.
    A label or dense field inferred as integers and later given a float fails once, and
    is then learned as doubles, which take both."""
    return pa.schema([f for f in table.schema if f.name in decoder.known and not _holds_only_nulls(f.type)])


def _holds_only_nulls(t: pa.DataType) -> bool:
    # A field every message lacked, or whose bags were all empty, says nothing of its type.
    return pa.types.is_null(t) or (pa.types.is_list(t) and pa.types.is_null(t.value_type))


def learned_types(decoder: RecordDecoder) -> pa.Schema | None:
    """The column types read_poll gives Arrow's reader for this decoder's next poll."""
    return _learned[decoder][0] if decoder in _learned else None


# Arrow types whose values are exactly what json.loads gives, per kind of field. Arrow
# promotes a column of 1 and 2.5 to doubles (an integer id would read as 1.0), an id
# over int64 to a double, a string like "2026-11-01" to a timestamp, and fills the keys
# an object lacks with nulls: any of those takes the per-message path.
_EXACT_SCALARS = (pa.types.is_null, pa.types.is_boolean, pa.types.is_int64, pa.types.is_string)


def _exact(t: pa.DataType, numbers: bool) -> bool:
    return any(check(t) for check in _EXACT_SCALARS) or (numbers and pa.types.is_float64(t))


def _typed_as_json(table: pa.Table, decoder: RecordDecoder, given: frozenset[str]) -> bool:
    """Whether every column the decoder reads holds the values json.loads would give.
    Labels and dense fields are read as floats, so a double there is exact; a sparse
    field's ids must keep their type, in a list or alone. Columns of `given` types were
    checked when those types were learned."""
    sparse, schema = decoder.spec.sparse_names, table.schema
    for name in table.column_names:  # names, not columns: a column object costs a microsecond
        if name not in decoder.known or name in given:
            continue  # unknown fields count only as present or not, which nulls keep
        t = schema.field(name).type
        if name in sparse and pa.types.is_list(t):
            t = t.value_type
        if not _exact(t, numbers=name not in sparse):
            return False
    return True


def _no_minus_nan(data: bytes) -> bool:
    # A search for one byte runs at memchr's speed, 50x the four-byte search's; "N" is
    # rare in events (hex ids are lower case), so the second search seldom runs.
    return b"N" not in data or b"-NaN" not in data


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
