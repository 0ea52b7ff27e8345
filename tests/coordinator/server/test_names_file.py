"""A shard's names file: each distinct table written once, every rank's names read back,
also across a restarted process appending to the same file and a line cut short."""
from __future__ import annotations

from rankscope.coordinator.server.names_file import NamesFile
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder


def _batch(rank: int, names: list[str]):
    bld = StepBatchBuilder(NameTable())
    for n in names:
        bld.add(n, Kind.PARAM, (1.0, 0.0, 0.5, 1.0), numel=4)
    return bld.build("j", rank, 0)


def test_a_table_many_ranks_send_is_written_once_and_read_back_for_each(tmp_path) -> None:
    path = tmp_path / "names.jsonl"
    f = NamesFile(path)
    f.write([_batch(r, ["a", "b"]) for r in range(3)] + [_batch(3, ["b", "c"])])
    f.close()
    lines = path.read_text().splitlines()
    assert sum('"table"' in line for line in lines) == 2 and len(lines) == 6
    got = {rank: {int(k): v for k, v in names.items()} for _, rank, names in NamesFile.read(path)}
    assert got == {0: {0: "a", 1: "b"}, 1: {0: "a", 1: "b"}, 2: {0: "a", 1: "b"}, 3: {0: "b", 1: "c"}}


def test_a_restarted_process_numbers_its_tables_again_and_both_are_read_right(tmp_path) -> None:
    path = tmp_path / "names.jsonl"
    old = NamesFile(path)
    old.write([_batch(0, ["a"])])
    old.close()
    with open(path, "a", encoding="utf-8") as out:
        out.write('["j", 9, ')  # the line the old process was writing when it died
    new = NamesFile(path)  # its table 0 is another table
    new.write([_batch(1, ["z"])])
    new.close()
    got = [(rank, list(names.values())) for _, rank, names in NamesFile.read(path)]
    assert got == [(0, ["a"]), (1, ["z"])]
