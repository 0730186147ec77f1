"""Partitions of day files, and ranges of them.

A partition is named by its date, `2026-11-01`, or by its date and hour, `2026-11-01T05`.
Its folder under the data root is `date=2026-11-01`, or `date=2026-11-01/hour=05`: the
layout Hive, Spark and Dataflow's file sinks write. A range is START..END, both ends in,
in the unit of its ends: `2026-11-01..2026-11-30` is 30 days and `2026-11-01T00..
2026-11-01T23` is 24 hours. Names sort in time order, as strings and as partitions.
"""

from __future__ import annotations

import datetime as dt
import re

# What a range does with a partition that has no files: stop there, or pass over it.
MISSING_POLICIES = ("fail", "skip")

_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:T(\d{2}))?$")
_FOLDERS = re.compile(r"(?:^|/)date=(\d{4}-\d{2}-\d{2})(?:/hour=(\d{2}))?(?:/|$)")
_HOURS = re.compile(r"^(\d{1,2})(?:\.\.(\d{1,2}))?$")
MAX_PARTITIONS = 100_000  # a range longer than this is a typo (years of hours), not a backfill


def parse_partition(name: str) -> tuple[dt.date, int | None]:
    """(date, hour or None) of a partition name; ValueError says what is wrong."""
    match = _NAME.match(name.strip())
    if not match:
        raise ValueError(f"{name!r} is not a partition: expected YYYY-MM-DD or YYYY-MM-DDTHH")
    try:
        date = dt.date.fromisoformat(match.group(1))
    except ValueError as err:
        raise ValueError(f"{name!r} is not a partition: {err}") from None
    hour = None if match.group(2) is None else int(match.group(2))
    if hour is not None and hour > 23:
        raise ValueError(f"{name!r} is not a partition: hour {hour} is not 00-23")
    return date, hour


def partition_name(date: dt.date, hour: int | None = None) -> str:
    return date.isoformat() if hour is None else f"{date.isoformat()}T{hour:02d}"


def next_partition(name: str) -> str:
    """The partition right after `name` in time: the next day, or the next hour."""
    date, hour = parse_partition(name)
    if hour is None:
        return partition_name(date + dt.timedelta(days=1))
    moment = dt.datetime.combine(date, dt.time(hour)) + dt.timedelta(hours=1)
    return partition_name(moment.date(), moment.hour)


def partition_start_ms(name: str) -> int:
    """A partition's first millisecond, epoch ms UTC."""
    date, hour = parse_partition(name)
    return int(dt.datetime.combine(date, dt.time(hour or 0), tzinfo=dt.timezone.utc).timestamp()) * 1000


def partition_end_ms(name: str) -> int:
    """Where a partition ends: the start of the next one (midnight or the next hour), epoch ms UTC."""
    return partition_start_ms(next_partition(name))


def partition_path(name: str) -> str:
    """The partition's folder, relative to the data root."""
    date, hour = parse_partition(name)
    return f"date={date.isoformat()}" + ("" if hour is None else f"/hour={hour:02d}")


def partition_time_ms(path: str) -> int | None:
    """The start of the partition a file lies in (the `date=`/`hour=` folders of its
    path), epoch ms UTC: the event time of its rows as far as a day file tells it. None for
    a path outside any partition."""
    match = _FOLDERS.search(str(path))
    if not match:
        return None
    try:
        return partition_start_ms(match.group(1) + ("" if match.group(2) is None else f"T{match.group(2)}"))
    except ValueError:
        return None


def partition_range(text: str) -> list[str]:
    """The partitions of START..END (or of one name), in time order."""
    start, sep, end = text.partition("..")
    first, last = parse_partition(start), parse_partition(end if sep else start)
    if (first[1] is None) != (last[1] is None):
        raise ValueError(f"range {text!r}: both ends are dates, or both are dates with an hour")
    step = dt.timedelta(hours=1) if first[1] is not None else dt.timedelta(days=1)
    begin, stop = (dt.datetime.combine(d, dt.time(h or 0)) for d, h in (first, last))
    if stop < begin:
        raise ValueError(f"range {text!r} ends before it starts")
    count = (stop - begin) // step + 1
    if count > MAX_PARTITIONS:
        raise ValueError(f"range {text!r} has {count} partitions, more than {MAX_PARTITIONS}")
    moments = (begin + i * step for i in range(count))
    return [partition_name(m.date(), None if first[1] is None else m.hour) for m in moments]


def with_hours(partitions: list[str], hours: str) -> list[str]:
    """Each date of `partitions` split into the hours of `hours` (H, or H..H, 0-23)."""
    match = _HOURS.match(hours.strip())
    if not match:
        raise ValueError(f"hours {hours!r}: expected H or H..H, e.g. 0..23")
    low = int(match.group(1))
    high = low if match.group(2) is None else int(match.group(2))
    if not 0 <= low <= high <= 23:
        raise ValueError(f"hours {hours!r}: expected 0 <= first <= last <= 23")
    out = []
    for name in partitions:
        date, hour = parse_partition(name)
        if hour is not None:
            raise ValueError(f"--hours splits dates into hours, but {name!r} already has an hour")
        out += [partition_name(date, h) for h in range(low, high + 1)]
    return out
