"""The packing plan: which sparse fields share one embedding table.

Fields with the same embedding dim share a table (one lookup and one update per group
instead of per field) unless a field's `group` names another. Inside a table each field
owns a contiguous range of rows starting at its row offset, so ids never collide across
fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from picasso.spec import FeatureSpec, SpecError


@dataclass(frozen=True)
class PackedGroup:
    name: str
    embedding_dim: int
    fields: tuple[str, ...]
    row_offsets: tuple[int, ...]  # first row of each field in the group's table
    num_rows: int
    mean_pooled: tuple[bool, ...]  # per field: divide the pooled sum by the bag length

    @property
    def num_fields(self) -> int:
        return len(self.fields)


@dataclass(frozen=True)
class PackingPlan:
    groups: tuple[PackedGroup, ...]

    @classmethod
    def from_spec(cls, spec: FeatureSpec) -> "PackingPlan":
        members: dict[str, list] = {}
        for f in spec.sparse:
            members.setdefault(f.group or f"dim{f.embedding_dim}", []).append(f)
        groups = []
        problems = []
        for name in sorted(members):
            fields = members[name]
            dims = sorted({f.embedding_dim for f in fields})
            if len(dims) > 1:
                problems.append(f"group '{name}': its fields mix embedding dims {dims}")
                continue
            offsets, start = [], 0
            for f in fields:
                offsets.append(start)
                start += f.num_rows
            groups.append(
                PackedGroup(
                    name=name,
                    embedding_dim=dims[0],
                    fields=tuple(f.name for f in fields),
                    row_offsets=tuple(offsets),
                    num_rows=start,
                    mean_pooled=tuple(f.pooling == "mean" for f in fields),
                )
            )
        if problems:
            raise SpecError(problems)
        return cls(groups=tuple(groups))
