"""The packing plan: which sparse fields share one embedding table.

Fields whose tables share their attributes (embedding dim and sparse optimizer; every
table is float32) share one table, so a step makes one lookup and one update per group
instead of one per field. A field's `group` overrides that; fields named into one group
must agree on dim and optimizer. Inside a table each field owns a contiguous range of
rows starting at its row offset, so ids never collide across fields.

A dynamic field (spec.DynamicTable) owns capacity + 1 rows like any other field, but
packing leaves its ids as 64-bit keys: the trainer maps them to rows
(picasso.dynamic_rows), because which row a key has is model state that training changes.

Feature crosses are packed like fields. A group also shares the part of the model its
fields feed (spec.PARTS): fields and crosses that feed both parts share the dim groups;
crosses that feed only the wide part, or only the deep part, get groups of their own,
which a model's deep embeddings, or its wide ones, leave out (PackingPlan.for_part).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from picasso.spec import FeatureSpec, SpecError

# Default group names of crosses that feed one part alone (a both-parts cross joins the
# fields' dim group).
_PART_ONLY = {"wide": "wide_crosses", "deep": "deep_crosses_dim{dim}"}


@dataclass(frozen=True)
class PackedGroup:
    name: str
    embedding_dim: int
    fields: tuple[str, ...]
    row_offsets: tuple[int, ...]  # first row of each field in the group's table
    num_rows: int
    mean_pooled: tuple[bool, ...]  # per field: divide the pooled sum by the bag length
    max_len: tuple[int, ...]  # per field: ids past this many in a bag are not looked up
    optimizer: str | None = None  # None: the trainer's default sparse optimizer
    # per field: a dynamic table's, whose packed ids are keys until the trainer maps them
    dynamic: tuple[bool, ...] = ()
    part: str = "both"  # the part of a model its fields feed (spec.PARTS)

    @property
    def num_fields(self) -> int:
        return len(self.fields)

    @property
    def id_offsets(self) -> tuple[int, ...]:
        """What packing adds to each field's ids: its row offset, or 0 for a dynamic
        field (its keys get the offset once they are mapped to rows)."""
        dynamic = self.dynamic or (False,) * self.num_fields
        return tuple(0 if d else offset for d, offset in zip(dynamic, self.row_offsets))

    @property
    def has_dynamic(self) -> bool:
        return any(self.dynamic)

    def table_bytes(self) -> int:
        return self.num_rows * self.embedding_dim * 4

    def slot_bytes(self, default_optimizer: str = "adagrad") -> int:
        """Bytes of optimizer state: (row-wise) adagrad keeps one float per row, element-wise
        adagrad one per value, adam two per value."""
        per_row = {"sgd": 0, "adagrad": 1, "adagrad_elementwise": self.embedding_dim,
                   "adam": 2 * self.embedding_dim}[self.optimizer or default_optimizer]
        return self.num_rows * per_row * 4


@dataclass(frozen=True)
class PackingPlan:
    groups: tuple[PackedGroup, ...]
    # The plan this one is a part of (for_part), None for a whole plan: embeddings over
    # parts of one plan still share a batch's ids (embedding.share_bags).
    whole: PackingPlan | None = field(default=None, compare=False, repr=False)

    @property
    def root(self) -> PackingPlan:
        return self.whole or self

    def for_part(self, part: str) -> PackingPlan:
        """The groups that feed `part` ("wide" or "deep") of a model: this plan itself
        where every group feeds both (a spec without one-part crosses), so that embeddings
        built from it share one plan object; else the same part object on every call."""
        if all(g.part == "both" for g in self.groups):
            return self
        parts = self.__dict__.setdefault("_parts", {})
        if part not in parts:
            parts[part] = PackingPlan(tuple(g for g in self.groups if g.part in ("both", part)), whole=self)
        return parts[part]

    @classmethod
    def from_spec(cls, spec: FeatureSpec) -> "PackingPlan":
        members: dict[str, list] = {}
        for f in spec.id_features:
            default_name = (f"dim{f.embedding_dim}" if f.part == "both" else _PART_ONLY[f.part].format(
                dim=f.embedding_dim)) + (f"_{f.optimizer}" if f.optimizer else "")
            members.setdefault(f.group or default_name, []).append(f)
        groups = []
        problems = []
        for name in sorted(members):
            fields = members[name]
            dims = sorted({f.embedding_dim for f in fields})
            optimizers = sorted({f.optimizer or "default" for f in fields})
            parts = sorted({f.part for f in fields})
            if len(dims) > 1:
                problems.append(f"group '{name}': its fields mix embedding dims {dims}")
            if len(optimizers) > 1:
                problems.append(f"group '{name}': its fields mix sparse optimizers {optimizers}")
            if len(parts) > 1:
                problems.append(f"group '{name}': its fields and crosses feed different parts of the model {parts}")
            if len(dims) > 1 or len(optimizers) > 1 or len(parts) > 1:
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
                    max_len=tuple(f.max_len for f in fields),
                    optimizer=fields[0].optimizer,
                    dynamic=tuple(f.dynamic is not None for f in fields),
                    part=parts[0],
                )
            )
        if problems:
            raise SpecError(problems)
        return cls(groups=tuple(groups))
