"""Two processes claiming one rank never share a dump folder: real processes racing for
the name, and a holder killed with SIGKILL giving it up without any clean-up of its own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from rankscope.dump.folder_claim import claim_path, claim_rank_label, release_rank_label

# Claims rank 0 for argv[1] once /go exists (so all start the race together), prints the
# label it got, then holds it until stdin closes.
CLAIMER = r"""
import os, sys, time
from rankscope.dump.folder_claim import claim_rank_label
go = sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.001)
label, holder = claim_rank_label(sys.argv[1], 0)
print(label, holder, flush=True)
sys.stdin.read()
"""


def claimers(dump, go, n):
    return [subprocess.Popen([sys.executable, "-c", CLAIMER, str(dump), str(go)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True) for _ in range(n)]


def test_racing_processes_get_one_rank_folder_and_each_loser_its_own(tmp_path):
    for attempt in range(5):  # several races: a lost update is a timing window
        go = tmp_path / f"go{attempt}"
        procs = claimers(tmp_path / f"dump{attempt}", go, 6)
        time.sleep(1.0)  # every interpreter up and polling
        go.touch()
        lines = [p.stdout.readline().split() for p in procs]
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
        labels = [label for label, _ in lines]
        assert labels.count("rank0") == 1, lines
        winner = procs[labels.index("rank0")].pid
        for p, (label, holder) in zip(procs, lines):
            if label != "rank0":
                assert label == f"proc{p.pid}"
                assert holder == str(winner), lines


def test_a_holder_killed_by_sigkill_frees_the_name(tmp_path):
    go = tmp_path / "go"
    go.touch()
    (holder,) = claimers(tmp_path / "dump", go, 1)
    assert holder.stdout.readline().split()[0] == "rank0"
    label, pid = claim_rank_label(tmp_path / "dump", 0)
    assert (label, pid) == (f"proc{os.getpid()}", holder.pid)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    label, pid = claim_rank_label(tmp_path / "dump", 0)
    assert (label, pid) == ("rank0", None)
    with open(claim_path(tmp_path / "dump", "rank0")) as fh:
        assert fh.read() == str(os.getpid())
    release_rank_label(tmp_path / "dump", "rank0")


def test_claiming_again_keeps_the_name_and_a_release_hands_it_on(tmp_path):
    dump = tmp_path / "dump"
    assert claim_rank_label(dump, 3) == ("rank3", None)
    assert claim_rank_label(dump, 3) == ("rank3", None)  # the same process asking again
    go = tmp_path / "go"
    go.touch()
    (other,) = claimers(dump, go, 1)  # claims rank 0, not ours: gets it
    assert other.stdout.readline().split()[0] == "rank0"
    other.stdin.close()
    other.wait(timeout=30)
    release_rank_label(dump, "rank3")
    script = ("import sys; from rankscope.dump.folder_claim import claim_rank_label; "
              "print(claim_rank_label(sys.argv[1], 3)[0])")
    out = subprocess.run([sys.executable, "-c", script, str(dump)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "rank3"


def test_no_rank_means_the_process_folder_and_no_claim(tmp_path):
    assert claim_rank_label(tmp_path / "dump", None) == (f"proc{os.getpid()}", None)
    assert not os.path.exists(claim_path(tmp_path / "dump", f"proc{os.getpid()}"))
