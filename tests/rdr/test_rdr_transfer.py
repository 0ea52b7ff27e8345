"""Bundle transfer: iter_file_chunks -> real ZeroMQ sockets -> protocol Decoder -> BundleAssembler."""
import json
import os

import pytest
import zmq

from rankscope.rdr.bundle import MANIFEST, verify_bundle, write_bundle
from rankscope.rdr.flight_recorder import FlightRecorder
from rankscope.rdr.transfer import BundleAssembler, iter_file_chunks
from rankscope.wire.protocol import BUNDLE_CHUNK, Decoder, Message, encode
from rankscope.wire.records import Kind, NameTable, StepBatchBuilder


@pytest.fixture
def bundle(tmp_path):
    names, fr = NameTable(), FlightRecorder(4)
    for s in range(4):
        b = StepBatchBuilder(names)
        for i in range(200):
            b.add(f"Cell.block{i}.Dense.forward.0.output.0", Kind.FORWARD, (float(s), 0.0, 0.5, 1.0))
        fr.emit(b.build("job", 3, s))
    d = write_bundle(tmp_path / "src", 3, reason="export", steps=fr, seeds={"seed": 1})
    assert (d / "flight_recorder_steps.msgpack").stat().st_size > 3 * 4096  # spans several chunks
    return d


@pytest.fixture
def wire():
    """A DEALER -> ROUTER pair on loopback tcp, frames validated by the real Decoder."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    decoder = Decoder(job="job")
    seq = iter(range(10**9))

    def send(body):
        dealer.send(encode(Message(BUNDLE_CHUNK, "job", "rank:3", next(seq), body)))
        assert router.poll(10_000), "chunk never arrived"
        _ident, frame = router.recv_multipart()
        msg = decoder.decode(frame)
        assert msg is not None, decoder.rejected  # every body we make must pass the schema
        return msg.body

    yield send
    dealer.close(0)
    router.close(0)
    ctx.term()


def files_of(d):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def test_round_trip_over_zeromq(bundle, wire, tmp_path):
    asm = BundleAssembler(tmp_path / "incident")
    done = [asm.accept(wire(b)) for b in iter_file_chunks([bundle], bundle.parent, 3, "exp-1", chunk_bytes=4096)]
    got = tmp_path / "incident" / "rank_3" / "rdr"
    assert asm.problems == []
    assert sorted(p.relative_to(got).as_posix() for p in done if p) == files_of(bundle)
    assert files_of(got) == files_of(bundle)  # no .part files left behind
    assert verify_bundle(got) == []
    assert json.loads((got / MANIFEST).read_text())["complete"] is True


def test_corrupted_chunk_detected_then_resent(bundle, wire, tmp_path):
    asm = BundleAssembler(tmp_path / "incident")
    target = "rdr/flight_recorder_steps.msgpack"
    corrupted = 0
    for body in iter_file_chunks([bundle], bundle.parent, 3, "exp-1", chunk_bytes=4096):
        if body["path"] == target and body["offset"] == 4096:
            body = dict(body, data=bytes([body["data"][0] ^ 0x01]) + body["data"][1:])  # one bit flipped
            corrupted += 1
        asm.accept(wire(body))
    assert corrupted == 1
    [problem] = asm.problems
    assert problem.path == target and "sha256 mismatch" in problem.reason and problem.rank == 3
    dest = tmp_path / "incident" / "rank_3" / target
    assert not dest.exists() and asm.resume_offsets(3, "exp-1") == {}  # discarded, not half-kept
    for body in iter_file_chunks([bundle / "flight_recorder_steps.msgpack"], bundle.parent, 3, "exp-1",
                                 chunk_bytes=4096):
        asm.accept(wire(body))
    assert dest.read_bytes() == (bundle / "flight_recorder_steps.msgpack").read_bytes()
    assert verify_bundle(dest.parent) == []


def test_resume_after_interruption(bundle, tmp_path):
    src = bundle / "flight_recorder_steps.msgpack"
    asm = BundleAssembler(tmp_path / "incident")
    chunks = iter_file_chunks([src], bundle.parent, 3, "exp-2", chunk_bytes=4096)
    for _ in range(2):
        assert asm.accept(next(chunks)) is None  # then the sender dies
    chunks.close()
    # A new assembler (e.g. a restarted coordinator) finds the progress on disk.
    asm2 = BundleAssembler(tmp_path / "incident")
    offsets = asm2.resume_offsets(3, "exp-2")
    assert offsets == {"rdr/flight_recorder_steps.msgpack": 8192}
    resent = list(iter_file_chunks([src], bundle.parent, 3, "exp-2", chunk_bytes=4096, resume=offsets))
    assert resent[0]["offset"] == 8192
    final = [asm2.accept(b) for b in resent][-1]
    assert final is not None and final.read_bytes() == src.read_bytes() and asm2.problems == []


def test_gap_and_bad_bodies_are_reported_not_raised(bundle, tmp_path):
    asm = BundleAssembler(tmp_path / "incident")
    chunks = list(iter_file_chunks([bundle / "flight_recorder_steps.msgpack"], bundle.parent, 3, "t",
                                   chunk_bytes=4096))
    assert asm.accept(chunks[1]) is None  # chunk 0 lost
    assert "gap" in asm.problems[-1].reason
    good = chunks[0]
    for bad, why in [
        (dict(good, path="../../etc/passwd"), "unsafe"), (dict(good, path="/abs"), "unsafe"),
        (dict(good, path="rdr/.hidden"), "unsafe"), (dict(good, rank=-1), "bad rank"),
        (dict(good, transfer="../x"), "transfer"), (dict(good, size=10), "outside file size"),
    ]:
        assert asm.accept(bad) is None and why in asm.problems[-1].reason
    assert not (tmp_path / "etc").exists() and not os.path.exists("/abs")


def test_unreadable_file_arrives_marked_incomplete(tmp_path):
    src = tmp_path / "src" / "rank_0" / "rdr"
    src.mkdir(parents=True)
    (src / "memory.json").write_text("{}")
    missing = src / "exception.txt"  # listed but gone by the time it is read
    asm = BundleAssembler(tmp_path / "dst")
    out = [asm.accept(b) for b in iter_file_chunks([src / "memory.json", missing],
                                                   src.parent, 0, "t")]
    assert out[0] == tmp_path / "dst" / "rank_0" / "rdr" / "memory.json"
    assert out[1] is None and "could not read" in asm.problems[-1].reason
    assert not (tmp_path / "dst" / "rank_0" / "rdr" / "exception.txt").exists()


def test_replayed_chunks_and_duplicate_files_never_overwrite(bundle, tmp_path):
    asm = BundleAssembler(tmp_path / "incident")
    bodies = list(iter_file_chunks([bundle / "seeds.json"], bundle.parent, 3, "t1"))
    first = asm.accept(bodies[0])
    assert asm.accept(bodies[0]) is None and asm.duplicates == 1  # spool replay after completion
    # Same name, different content, new transfer: kept beside the first, never over it.
    other = tmp_path / "other" / "rdr"
    other.mkdir(parents=True)
    (other / "seeds.json").write_text('{"seed": 2}')
    second = [asm.accept(b) for b in iter_file_chunks([other / "seeds.json"], other.parent, 3, "t2")][-1]
    assert second == first.with_name("seeds.json.1")
    assert json.loads(first.read_text()) == {"seed": 1} and json.loads(second.read_text()) == {"seed": 2}


def test_paths_outside_root_rejected(bundle, tmp_path):
    with pytest.raises(ValueError, match="not under root"):
        list(iter_file_chunks([bundle / "seeds.json"], tmp_path / "elsewhere", 3, "t"))
