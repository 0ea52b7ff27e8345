"""One private Ray for the modules of this folder.

Starting a local Ray costs 10-15 s on a loaded CI machine; each module here used to start
and stop its own. They now share one, started by the first module that asks and shut down
when the run leaves this folder: the Helm test under tests/deploy starts a Ray of its own
in this process, and Ray allows one per process. Every actor here is named in its
module's own namespace, so modules do not see each other's actors.
"""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def folder_ray():
    import ray
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, namespace="rankscope-test-server", log_to_driver=False)
    return ray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # After the item's own fixtures are torn down (theirs may still use Ray).
    result = yield
    if nextitem is None or HERE not in Path(nextitem.path).resolve().parents:
        import sys
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    return result
