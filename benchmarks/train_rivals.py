"""What benchmarks.train runs beside picasso: the same model, written the ways a user would
write it instead.

Each rival starts from a picasso model of the same spec and seed (`template`), copies its
initial embedding rows and deep-copies its dense part, so that all of them compute the
same model from the same weights. Each trains with element-wise Adagrad on the embeddings
(torch.optim.Adagrad's arithmetic, which FBGEMM's EXACT_ADAGRAD and picasso's
adagrad_elementwise also have) and torch.optim.Adam on the dense part.

- NaiveRival: a Python loop over row dicts (each value validated and hashed, memoised,
  which favours it) into per-field tensors, and one nn.EmbeddingBag per field and part.
- PlainRival: what a competent PyTorch user writes. Columnar collation straight from the
  decoded Arrow batch (each field's ids and bag offsets are views of its list column: no
  loop over rows), then one nn.EmbeddingBag per field and part, with offsets.
- TorchRecRival: TorchRec's FusedEmbeddingBagCollection (the optimizer fused into the
  backward, FBGEMM's table-batched kernels), one per part, fed a KeyedJaggedTensor built
  from the decoded Arrow batch. A KJT is key-major, which is how Arrow holds the columns:
  its values are the fields' id columns one after the other, its lengths their bag
  lengths; the constructor takes them without a sync (the fastest documented route).

The plain and TorchRec rivals decode with picasso's RecordDecoder (validation and id
hashing, vectorised), as picasso does, so the difference measured is what comes after.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels.hashing import bucket_of
from picasso.models.common import dense_autocast

LR_SPARSE, LR_DENSE, EPS = 0.05, 1e-3, 1e-8


class _EmbeddingBagModel(torch.nn.Module):
    """One nn.EmbeddingBag per field and part, holding that field's initial rows of the
    template's packed table, and the template's dense part."""

    def __init__(self, spec, template):
        super().__init__()
        self.plan = template.embedding.plan
        self.fields = [spec.sparse_field(name) for g in self.plan.groups for name in g.fields]
        self.group_sizes = [g.num_fields for g in self.plan.groups]
        self.parts = torch.nn.ModuleList(torch.nn.ModuleList(self._bags(spec, packed)) for packed in template.embeddings())
        self.dense_part = copy.deepcopy(template.dense_part)

    def _bags(self, spec, packed):
        for group in self.plan.groups:
            table = packed.tables[group.name]
            for name, start in zip(group.fields, group.row_offsets):
                field = spec.sparse_field(name)
                bag = torch.nn.EmbeddingBag(field.num_rows, table.shape[1], mode=field.pooling, sparse=True)
                bag.weight.data.copy_(table[start:start + field.num_rows])
                yield bag

    def pooled(self, fields: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        pooled = []
        starts = np.cumsum([0, *self.group_sizes[:-1]])
        for bags in self.parts:
            per_field = [bag(ids, offsets) for bag, (ids, offsets) in zip(bags, fields)]
            pooled += [torch.stack(per_field[a:a + n], dim=1) for a, n in zip(starts, self.group_sizes)]
        return pooled


class _Rival:
    """A model, its two optimizers and its collation: train(batches) steps through raw
    Arrow record batches; predict(table) scores a raw table."""

    precision = "fp32"

    def collate(self, batch: pa.RecordBatch):
        """(labels, dense, sparse inputs) of one raw batch."""
        raise NotImplementedError

    def pooled(self, sparse) -> list[torch.Tensor]:
        raise NotImplementedError

    def logits(self, dense, sparse) -> torch.Tensor:
        pooled = self.pooled(sparse)
        with dense_autocast(self.precision, dense.device):  # as picasso's models do
            return self.dense_part(dense, pooled).float()

    def train(self, batches) -> int:
        samples = 0
        for batch in batches:
            labels, dense, sparse = self.collate(batch)
            loss = F.binary_cross_entropy_with_logits(self.logits(dense, sparse), labels)
            for optimizer in self.optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for optimizer in self.optimizers:
                optimizer.step()
            samples += batch.num_rows
        return samples

    @torch.no_grad()
    def predict(self, table: pa.Table) -> np.ndarray:
        labels, dense, sparse = self.collate(table.combine_chunks().to_batches()[0])
        return torch.sigmoid(self.logits(dense, sparse)).numpy()


class _BagRival(_Rival):
    def __init__(self, spec, template, precision: str):
        self.spec, self.precision = spec, precision
        self.model = _EmbeddingBagModel(spec, template)
        self.dense_part = self.model.dense_part
        sparse = [p for bags in self.model.parts for p in bags.parameters()]
        self.optimizers = [torch.optim.Adagrad(sparse, lr=LR_SPARSE, eps=EPS),
                           torch.optim.Adam(self.dense_part.parameters(), lr=LR_DENSE)]

    def pooled(self, sparse):
        return self.model.pooled(sparse)


class NaiveRival(_BagRival):
    """Rows as dicts, collated one value at a time."""

    def __init__(self, spec, template, precision: str = "fp32"):
        super().__init__(spec, template, precision)
        self.memo: dict = {}

    def collate(self, batch):
        spec, memo = self.spec, self.memo
        rows = batch.to_pylist()
        labels = torch.tensor([float(r[spec.label]) for r in rows])
        dense = torch.tensor([[math.copysign(math.log1p(abs(r[f.name] or 0.0)), r[f.name] or 0.0) for f in spec.dense]
                              for r in rows])
        fields = []
        for f in self.model.fields:
            ids, offsets = [], []
            for r in rows:
                offsets.append(len(ids))
                value = r.get(f.name)
                for raw in [] if value is None else value if isinstance(value, list) else [value]:
                    key = (f.name, raw)
                    if key not in memo:
                        memo[key] = bucket_of(raw, f.hash_buckets)
                    ids.append(memo[key])
            fields.append((torch.tensor(ids, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)))
        return labels, dense, fields


class _Columnar:
    """Decoded Arrow columns as tensors, with no loop over rows."""

    def __init__(self, spec, field_names: list[str]):
        self.spec = spec
        self.decoder = RecordDecoder(spec)
        self.field_names = field_names

    def columns(self, batch: pa.RecordBatch):
        """(labels, dense, per field (ids, bag offsets)); ids and offsets are views of the
        list column's buffers."""
        table = self.decoder.decode_table(batch, "bench").table.combine_chunks()
        labels = torch.from_numpy(table.column("label").to_numpy())
        # A spec may have no dense field (its signal all in the sparse ones): (N, 0), as picasso's batches.
        dense = torch.from_numpy(np.stack([table.column(f.name).to_numpy() for f in self.spec.dense], axis=1)
                                 if self.spec.dense else np.zeros((table.num_rows, 0), np.float32))
        fields = []
        for name in self.field_names:
            column = table.column(name).chunk(0)
            offsets = column.offsets.to_numpy()
            ids = column.values.to_numpy()[offsets[0]:offsets[-1]]
            fields.append((torch.from_numpy(ids), torch.from_numpy(offsets[:-1] - offsets[0])))
        return labels, dense, fields


class PlainRival(_BagRival):
    """Columnar collation and one EmbeddingBag per field, with offsets."""

    def __init__(self, spec, template, precision: str = "fp32"):
        super().__init__(spec, template, precision)
        self.columnar = _Columnar(spec, [f.name for f in self.model.fields])

    def collate(self, batch):
        return self.columnar.columns(batch)


# FBGEMM's tables take dims that are multiples of 4.
_WIDE_COLUMNS = 4


class TorchRecRival(_Rival):
    """One FusedEmbeddingBagCollection, one table per field, fed one KeyedJaggedTensor per
    batch. Wide&Deep's dim-1 wide rows ride in the deep tables as 4 more columns (FBGEMM's
    tables take multiples of 4; the model reads the first, the others get zero gradients and
    never move, which element-wise Adagrad allows): one lookup serves both parts."""

    def __init__(self, spec, template, precision: str = "fp32"):
        from torchrec import EmbeddingBagConfig, PoolingType
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        self.precision = precision
        self.plan = plan = template.embedding.plan
        self.deep, *wide = template.embeddings()
        self.wide = wide[0] if wide else None
        # FusedEmbeddingBagCollection's output holds its sum-pooled tables first, then its
        # mean-pooled ones, whatever order its keys() report: give it the tables in that
        # order, and gather each plan group's columns from where they land.
        fields = sorted(((spec.sparse_field(name), group) for group in plan.groups for name in group.fields),
                        key=lambda pair: pair[0].pooling == "mean")
        configs, column = [], {}
        for field, group in fields:
            column[field.name] = sum(config.embedding_dim for config in configs)
            configs.append(EmbeddingBagConfig(
                name=f"t_{field.name}", embedding_dim=self._width(group), num_embeddings=field.num_rows,
                feature_names=[field.name], pooling=PoolingType.MEAN if field.pooling == "mean" else PoolingType.SUM))
        self.keys = [config.feature_names[0] for config in configs]
        self.columnar = _Columnar(spec, self.keys)
        self.group_columns = [
            torch.tensor([column[name] + c for name in group.fields for c in range(self._width(group))])
            for group in plan.groups
        ]
        self.collection = FusedEmbeddingBagCollection(tables=configs, optimizer_type=torch.optim.Adagrad,
                                                      optimizer_kwargs={"lr": LR_SPARSE, "eps": EPS},
                                                      device=torch.device("cpu"))
        self._copy_rows(spec)
        self.dense_part = copy.deepcopy(template.dense_part)
        self.optimizers = [torch.optim.Adam(self.dense_part.parameters(), lr=LR_DENSE)]

    def _width(self, group) -> int:
        return self.deep.group_dims[group.name] + (_WIDE_COLUMNS if self.wide is not None else 0)

    def _copy_rows(self, spec) -> None:
        state = self.collection.state_dict()  # views of the fused tables' storage
        for group in self.plan.groups:
            dim = self.deep.group_dims[group.name]
            for name, start in zip(group.fields, group.row_offsets):
                rows = slice(start, start + spec.sparse_field(name).num_rows)
                weight = state[f"embedding_bags.t_{name}.weight"]
                weight[:, :dim].copy_(self.deep.tables[group.name][rows])
                if self.wide is not None:
                    weight[:, dim:].zero_()
                    weight[:, dim:dim + 1].copy_(self.wide.tables[group.name][rows])

    def collate(self, batch):
        from torchrec import KeyedJaggedTensor

        labels, dense, fields = self.columnar.columns(batch)
        ends = [torch.cat([offsets, offsets.new_tensor([ids.numel()])]) for ids, offsets in fields]
        features = KeyedJaggedTensor(keys=self.keys, values=torch.cat([ids for ids, _ in fields]),
                                     lengths=torch.cat([end.diff() for end in ends]).to(torch.int32))
        return labels, dense, features

    def pooled(self, features):
        values = self.collection(features).values()  # (N, Σ widths)
        deep, wide = [], []
        for group, columns in zip(self.plan.groups, self.group_columns):
            width, dim = self._width(group), self.deep.group_dims[group.name]
            block = values.index_select(1, columns).view(-1, group.num_fields, width)
            deep.append(block[..., :dim])
            wide.append(block[..., dim:dim + 1])
        return deep + (wide if self.wide is not None else [])
