"""Zero-code attach: ``rankscope launch`` puts this directory first on PYTHONPATH, so
every Python process the launched command starts (msrun's workers included) runs this
at interpreter start-up.

It must cost nothing in processes that never train (msrun's own launcher, helper
scripts): ``rankscope.probe.attach.autoattach.install`` only registers a lazy hook that acts when
MindSpore is imported. Any failure is reported and swallowed: attaching must never
stop the user's program from starting.
"""
import os
import sys


def _chain_next_sitecustomize() -> None:
    # Putting our directory first shadows any sitecustomize the environment already
    # had (e.g. a distro's); run that one too so launch changes nothing else.
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_rankscope_chained_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


def _attach() -> None:
    if os.environ.get("RANKSCOPE_ATTACH") != "1":
        return
    try:
        from rankscope.probe.attach.autoattach import install
        install()
    except Exception as exc:  # never block the user's program
        try:
            from rankscope.probe.attach.autoattach import report_attach_failure
            report_attach_failure(exc)
        except Exception:
            print(f"[rankscope] attach failed, running unprobed: {exc!r}", file=sys.stderr)


try:
    _chain_next_sitecustomize()
except Exception as exc:
    print(f"[rankscope] the environment's own sitecustomize failed: {exc!r}", file=sys.stderr)
_attach()
