"""The snapshot as the page reads it: the coordinator's console snapshot plus the lines
the terminal prints (coverage, layout, warnings) and a link to each incident's report
under the console's ``/files/``. Plain functions over dicts, testable without a server."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from rankscope.coordinator.logic.views.coverage import describe


def page_snapshot(snapshot: dict[str, Any], export_dir: Path | None) -> dict[str, Any]:
    out = dict(snapshot)
    jobs = out.get("jobs") or {}
    out["coverage_lines"] = [describe(report) for _, report in sorted((out.get("coverage") or {}).items())]
    out["layout_lines"] = [j["layout"]["line"] for _, j in sorted(jobs.items()) if (j.get("layout") or {}).get("line")]
    out["warnings"] = [j["same_data"]["line"] for _, j in sorted(jobs.items())
                       if (j.get("same_data") or {}).get("line")]
    out["incidents"] = [{**inc, "report_url": report_url(inc.get("dir"), export_dir)}
                        for inc in out.get("incidents") or []]
    urls = {inc["incident_id"]: inc["report_url"] for inc in out["incidents"]}
    out["verdicts"] = [{**v, "report_url": urls.get(v.get("incident_id"))} for v in out.get("verdicts") or []]
    return out


def report_url(incident_dir: str | None, export_dir: Path | None) -> str | None:
    """``/files/<incident folder>/report.html`` when the folder lies in the export folder."""
    if not incident_dir or export_dir is None:
        return None
    d, root = Path(incident_dir).resolve(), export_dir.resolve()
    if root not in d.parents:
        return None
    return "/files/" + quote(f"{d.relative_to(root).as_posix()}/report.html")
