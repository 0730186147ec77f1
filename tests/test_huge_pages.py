"""Big host tables are asked onto transparent huge pages before their first touch."""

from __future__ import annotations

from pathlib import Path

import torch

from picasso import huge_pages
from picasso.embedding import PackedEmbedding
from picasso.packing import PackingPlan
from picasso.builtin_specs import builtin_spec

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_a_big_tensor_is_marked_where_the_kernel_offers_huge_pages_and_a_small_one_never():
    offered = THP.exists() and "[never]" not in THP.read_text()
    big = huge_pages.empty(huge_pages.WORTH_BYTES // 4 + 1000)
    assert huge_pages.advise(big) == offered
    assert not huge_pages.advise(torch.empty(1000))
    assert not huge_pages.advise(torch.empty(0))


def test_tables_on_huge_pages_start_with_the_values_of_a_plain_fill():
    plan = PackingPlan.from_spec(builtin_spec("criteo"))
    torch.manual_seed(3)
    embedding = PackedEmbedding(plan)
    group = plan.groups[0]
    torch.manual_seed(3)
    expected = torch.empty(group.num_rows, group.embedding_dim).uniform_(-0.05, 0.05)
    assert embedding.tables[group.name].nbytes >= huge_pages.WORTH_BYTES  # a table that was marked
    assert torch.equal(embedding.tables[group.name], expected)
    assert not any(slot.any() for slot in embedding.slots(group.name))
