"""Fixtures shared across test modules."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def pynative_cpu():
    """PyNative mode on CPU for in-process MindSpore tests.

    MindSpore lets a process choose its device once, before the runtime starts; in one
    pytest process an earlier module has usually started it already (on CPU, the only
    device here), and a second ``set_device`` raises. Set it only while it is still free.
    """
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        ms.set_device("CPU")
    except RuntimeError:
        if ms.get_context("device_target") != "CPU":
            raise
    return ms


@pytest.fixture(autouse=True, scope="session")
def _own_job_index(tmp_path_factory):
    """Launches under test record their jobs in a folder of their own, never the user's
    ~/.rankscope (children inherit the variable)."""
    import os
    old = os.environ.get("RANKSCOPE_HOME")
    os.environ["RANKSCOPE_HOME"] = str(tmp_path_factory.mktemp("rankscope-home"))
    yield
    if old is None:
        os.environ.pop("RANKSCOPE_HOME", None)
    else:
        os.environ["RANKSCOPE_HOME"] = old


@pytest.fixture
def short_tmp():
    """A folder with a short path: unix socket paths (Ray's, the node agents') must stay
    under 108 bytes, which pytest's own tmp_path can exceed."""
    import shutil
    import tempfile
    from pathlib import Path
    path = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
