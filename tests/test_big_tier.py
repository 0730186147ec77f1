"""The big tier made on disk (picasso.big_tier): a seeded table is the same bytes as in
memory, slots read as zeros without being written, a table is never whole in this
process's resident memory while it is made, and a Trainer with `big_tier_dir` makes its
tables and slots as the folder's files (training exactly as in memory: test_cache.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from picasso import big_tier
from picasso.cache import CacheConfig, HotCache
from picasso.trainer import Trainer

from test_trainer import CONFIG, SPEC


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("rows, width, chunk_bytes", [(10_007, 8, 4096 * 3), (1, 16, 64), (5_000, 1, 1 << 20)])
def test_a_seeded_table_on_disk_is_the_same_bytes_as_in_memory(tmp_path, monkeypatch, rows, width, chunk_bytes):
    monkeypatch.setattr(big_tier, "CHUNK_BYTES", chunk_bytes)  # several chunks, a partial last one
    torch.manual_seed(7)
    in_memory = big_tier.uniform(rows, width, -0.05, 0.05, "table_g")
    after_memory = torch.rand(3)
    torch.manual_seed(7)
    with big_tier.files_under(tmp_path):
        on_disk = big_tier.uniform(rows, width, -0.05, 0.05, "table_g")
    after_disk = torch.rand(3)  # the generator was left where the one call leaves it
    assert big_tier.path_of(in_memory) is None
    path = big_tier.path_of(on_disk)
    assert path is not None and path.parent == tmp_path and path.stat().st_size == rows * width * 4
    assert torch.equal(in_memory, on_disk) and torch.equal(after_memory, after_disk)
    assert path.read_bytes() == in_memory.numpy().tobytes()  # the file holds the values themselves


def test_a_slot_on_disk_is_a_sparse_file_of_zeros(tmp_path):
    shape = (4_000_000,)  # 16 MB, none of it written
    with big_tier.files_under(tmp_path):
        slot = big_tier.zeros(shape, "slot0_g")
    path = big_tier.path_of(slot)
    assert path.stat().st_size == 16_000_000 and path.stat().st_blocks * 512 < 1_000_000
    assert not slot.any()
    slot[123] = 2.5  # written through to the file
    assert torch.from_file(str(path), size=shape[0], dtype=torch.float32)[123] == 2.5
    big_tier.discard(slot)
    assert not path.exists()


def test_outside_the_block_and_with_no_folder_tables_stay_in_memory(tmp_path):
    with big_tier.files_under(None):
        assert big_tier.path_of(big_tier.zeros((10,), "slot0_g")) is None
    with big_tier.files_under(tmp_path):
        pass
    assert big_tier.path_of(big_tier.uniform(10, 2, 0.0, 1.0, "table_g")) is None
    assert list(tmp_path.iterdir()) == []


def test_an_empty_table_on_disk_is_an_empty_tensor(tmp_path):
    with big_tier.files_under(tmp_path):
        table = big_tier.uniform(0, 8, -0.05, 0.05, "table_g")
    assert table.shape == (0, 8) and list(tmp_path.iterdir()) == []


def test_a_table_on_disk_is_never_whole_in_resident_memory_while_it_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr(big_tier, "CHUNK_BYTES", 4 << 20)
    table_bytes = 256 << 20
    before = resident_bytes()
    with big_tier.files_under(tmp_path):
        table = big_tier.uniform(table_bytes // 32, 8, -0.05, 0.05, "table_g")
    grown = resident_bytes() - before
    # In memory it would hold all 256 MiB; made in chunks it holds about one chunk.
    assert grown < 32 << 20, f"resident memory grew by {grown >> 20} MiB making a 256 MiB table on disk"
    assert float(table[-1].abs().max()) <= 0.05 and float(table[-1].abs().max()) > 0  # the last chunk is filled


def test_a_trainer_with_a_big_tier_dir_makes_its_tables_and_slots_as_the_folders_files(tmp_path):
    folder = tmp_path / "big"
    trainer = Trainer(SPEC, replace(CONFIG, cache=CacheConfig(capacity="10%", big_tier_dir=str(folder))))
    made = set()
    for embedding in trainer.model.embeddings():
        for group in embedding.tables:
            for tensor in (embedding.tables[group], *embedding.slots(group)):
                made.add(big_tier.path_of(tensor))
    # Every table and slot is one of the folder's files, and the folder holds no other
    # (the slots of the optimizer the model was built with, before the run's, are removed).
    assert None not in made and made == set(folder.iterdir())
    seeded_in_memory = Trainer(SPEC, CONFIG)
    for cached, plain in zip(trainer.model.embeddings(), seeded_in_memory.model.embeddings()):
        for group in plain.tables:
            assert torch.equal(cached.tables[group], plain.tables[group]), group


def test_a_cache_over_tables_made_in_memory_copies_them_into_the_folder(tmp_path):
    """An embedding built outside a Trainer's files_under: the cache's big tier holds file
    copies of its tables and slots, the same values."""
    trainer = Trainer(SPEC, CONFIG)
    embeddings = trainer.model.embeddings()
    before = [{group: e.tables[group].clone() for group in e.tables} for e in embeddings]
    HotCache(embeddings, CacheConfig(capacity="10%", big_tier_dir=str(tmp_path / "big")), torch.device("cpu"))
    for embedding, tables in zip(embeddings, before):
        for group, values in tables.items():
            for tensor in (embedding.tables[group], *embedding.slots(group)):
                assert big_tier.path_of(tensor).parent == tmp_path / "big"
            assert torch.equal(embedding.tables[group], values), group
