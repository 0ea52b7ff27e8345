"""msrun's scheduler runs the training script with RANK_ID=0 but never trains: the
zero-code attach leaves it alone, so it cannot claim rank 0 beside the real rank 0."""
from __future__ import annotations

import sys

from rankscope.probe.attach import autoattach


def test_msrun_scheduler_process_is_not_probed(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    before = list(sys.meta_path)
    autoattach.install()
    try:
        assert sys.meta_path == before and autoattach.session() is None
    finally:
        autoattach.uninstall()
