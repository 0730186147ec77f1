"""A version's lineage in words: what it trained since the version before it in its
model's life (registry_tags.ORIGIN), the partitions of a daily run or the offsets of a
stream's window. The parent itself is the checkpoint the run started from (a tag the
publish turns into a version number: serving/publishing/publication.py)."""

from __future__ import annotations

MAX_SOURCES = 50  # partitions or sources named in one tag; beyond that, a count


def partitions_origin(partitions) -> str:
    partitions = list(partitions)
    named = ", ".join(partitions[:MAX_SOURCES])
    more = f" and {len(partitions) - MAX_SOURCES} more" if len(partitions) > MAX_SOURCES else ""
    return f"{'partition' if len(partitions) == 1 else 'partitions'} {named}{more}"


def stream_origin(since: dict[str, int], now: dict[str, int]) -> str:
    """The offsets a stream's version trained since the one before: [since, now) a source."""
    spans = [f"{source} [{since.get(source, now[source])}, {now[source]})" for source in sorted(now)
             if since.get(source) != now[source]]
    more = f" and {len(spans) - MAX_SOURCES} more" if len(spans) > MAX_SOURCES else ""
    return f"stream {', '.join(spans[:MAX_SOURCES]) or 'nothing new'}{more}"
