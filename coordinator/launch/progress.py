"""What ``rankscope launch`` prints while a job runs and when it ends.

Progress lines are printed only when something changed (ranks attached, a new step
judged, an incident), so a long job is not a wall of repeats and a short one is not
a silent minute.
"""
from __future__ import annotations

from typing import Any, Callable

from rankscope.coordinator.launch.watched import attached_ranks
from rankscope.coordinator.logic.verdict import JOB_WIDE
from rankscope.text.spans import rank_span
from rankscope.text.watch_line import cost_text, merged_cost, plan_of, watch_line


class ProgressPrinter:
    def __init__(self, say: Callable[[str], None], every_steps: int = 1) -> None:
        self.say = say
        self.every_steps = every_steps
        self._ranks = -1
        self._judged = -1
        self._incidents: set[str] = set()
        self._watch_said: set[str] = set()
        self._plans: dict[str, tuple | None] = {}  # each rank's watch plan as last said (plan_of)
        self._layout: dict[str, str] = {}
        self._same_data: set[str] = set()
        #: Each rank's newest watch status, for the end-of-run lines.
        self.watch: dict[str, dict] = {}

    def update(self, status: dict[str, Any]) -> None:
        ranks = status.get("ranks") or {}
        attached = attached_ranks(status)
        if len(attached) != self._ranks:
            self._ranks = len(attached)
            ids = ", ".join(map(str, attached))
            self.say(f"{self._ranks} rank(s) attached: {ids}" if attached else "waiting for ranks to attach")
        new: dict[str, dict] = {}
        for r, info in sorted(ranks.items(), key=lambda kv: int(kv[0])):
            w = info.get("watch")
            if isinstance(w, dict):
                self.watch[r] = w
                plan = plan_of(w.get("cost"))
                # Said again when the rank's watch plan changes (K, weights fingerprinted
                # every K steps, and the Cell hooks kept or not, set once steps are measured).
                if r not in self._watch_said or self._plans.get(r, plan) != plan:
                    self._watch_said.add(r)
                    new[r] = w
                self._plans[r] = plan
        # Ranks that said alike at once share a line: under msrun each rank's own line is
        # echoed from its log too, and a thousand ranks must not print a thousand more.
        for line in watch_summary(new):
            self.say(line)
        judged = status.get("last_judged_step")
        if judged is not None and judged >= 0:
            # Said once the first step is judged: by then every rank's part of it was in.
            for job, j in sorted((status.get("jobs") or {}).items()):
                line = (j.get("layout") or {}).get("line")
                if line and self._layout.get(job) != line:
                    self._layout[job] = line
                    self.say(f"layout: {line}")
                same = j.get("same_data") or {}
                if same.get("line") and job not in self._same_data:
                    self._same_data.add(job)
                    self.say(f"WARNING: {same['line']}")
        if judged is not None and judged >= 0 and judged != self._judged \
                and (judged - self._judged >= self.every_steps or self._judged < 0):
            self._judged = judged
            order = sorted(ranks.items(), key=lambda kv: int(kv[0]))
            steps = ", ".join(f"{r}:{shown(info.get('step'))}" for r, info in order)
            # A rank whose newest step is older never sent this one: it was judged without it.
            behind = [int(r) for r, info in order if isinstance(info.get("step"), int) and info["step"] < judged]
            over = f"without {rank_span(behind)}" if behind else "across all ranks"
            self.say(f"step {judged} judged {over} (each rank's newest step {steps})")
        for inc in status.get("incidents") or []:
            iid = inc.get("incident_id")
            if iid and iid not in self._incidents:
                self._incidents.add(iid)
                if inc.get("detector") == "manual":
                    self.say(f"EXPORT on an operator's request at step {shown(inc.get('step'))} (no divergence named); "
                             f"state {shown(inc.get('state'))}")
                    continue
                split = undecided(inc)
                if job_wide(inc):
                    self.say(f"JOB-WIDE: {shown(inc.get('detector'))} at step {shown(inc.get('step'))} on "
                             f"{what_of(inc)}: {(inc.get('evidence') or {}).get('rule', '')}; no rank named, "
                             "exported, the job runs "
                             f"on; state {shown(inc.get('state'))}")
                elif split:
                    self.say(f"UNDECIDED: {shown(inc.get('detector'))}: {rank_span(split)} disagree at step "
                             f"{shown(inc.get('step'))} ({what_of(inc)}) and nothing tells which is wrong; "
                             f"exported, the job runs on; state {shown(inc.get('state'))}")
                else:
                    self.say(f"DIVERGENCE: {shown(inc.get('detector'))} names rank "
                             f"{shown(inc.get('first_diverging_rank'))} at step {shown(inc.get('step'))} "
                             f"({what_of(inc)}); state {shown(inc.get('state'))}")
                hint = (inc.get("evidence") or {}).get("hint")
                if hint:
                    self.say(f"  hint: {hint}")
                rerun = (inc.get("evidence") or {}).get("rerun")
                if isinstance(rerun, dict):
                    self.say(f"  re-run: {rerun.get('line')}")


def shown(value: Any) -> str:
    """A value for a terminal: "—" where there is none, never "None"."""
    return "—" if value is None or value == "" else str(value)


def watch_summary(watch: dict[str, dict], ranks: Any = ()) -> list[str]:
    """End-of-run lines: how each rank was watched, one line per way of watching (ranks
    watched alike share it, so a thousand-rank job does not print a thousand lines);
    ranks that never said are named."""
    alike: dict[tuple[str, str, str, str, str], list[int]] = {}
    costs: dict[tuple[str, str, str, str, str], list[dict | None]] = {}
    for r, w in watch.items():
        cost = w.get("cost") if isinstance(w.get("cost"), dict) else None
        # Grouped by the plan, not by what each rank measured (that differs by a hair).
        key = (str(w.get("mode", "?")), str(w.get("how", "?")), str(w.get("reason") or ""), str(w.get("rerun") or ""),
               cost_text(cost, measured=False))
        alike.setdefault(key, []).append(int(r))
        costs.setdefault(key, []).append(cost)
    lines = [watch_line(None, mode, how, reason, who=rank_span(sorted(rs)), rerun=rerun,
                     cost=merged_cost(costs[(mode, how, reason, rerun, plan)]))
             for (mode, how, reason, rerun, plan), rs in sorted(alike.items(), key=lambda kv: min(kv[1]))]
    silent = sorted({int(r) for r in ranks} - {int(r) for r in watch})
    if silent:
        lines.append(f"{rank_span(silent)}: watch status unknown (never reported one)")
    return lines


def _failed_step_note(ev: dict[str, Any]) -> str:
    if ev.get("after_last_step") is not None:
        return "  (its last step: it failed after completing it)"
    return "  (the first step it did not complete)"


def undecided(incident: dict[str, Any]) -> list[int]:
    """The ranks that disagree where nothing tells which of them is wrong (two replicas,
    a replica split with no majority): naming one of them "first" would be a guess; []
    for any other finding."""
    if "decided" in incident:
        return [] if incident["decided"] else sorted(int(r) for r in incident.get("undecided_between") or [])
    # A document from before "decided": a replica split with no majority named no one.
    if incident.get("detector") != "replica" or (incident.get("evidence") or {}).get("majority") is not False:
        return []
    return sorted(int(r) for r in [incident.get("first_diverging_rank"), *(incident.get("ties") or [])]
                  if r is not None)


def job_wide(incident: dict[str, Any]) -> str:
    """For a finding every rank runs (no rank is wrong, the job is), the sentence that says
    so; "" for any other."""
    return str((incident.get("evidence") or {}).get(JOB_WIDE) or "")


def what_of(incident: dict[str, Any]) -> str:
    """The tensor a value finding names, or how a failed rank failed."""
    if incident.get("tensor"):
        return str(incident["tensor"])
    ev = incident.get("evidence") or {}
    return str(ev.get("manner") or ev.get("rule") or "—")


#: What an undecided verdict adds about the job: a live job runs on.
LIVE_UNDECIDED = "the job was left running; the bundles are exported"


def format_verdict(incident: dict[str, Any], undecided_note: str = LIVE_UNDECIDED) -> str:
    """The end-of-run verdict: the one line a user reads, then where everything is."""
    ties = incident.get("ties") or []
    tie_note = f" (tied with rank(s) {', '.join(map(str, ties))})" if ties else ""
    ev = incident.get("evidence") or {}
    failed = incident.get("detector") == "progress" and "failed_at" in ev
    head = f"rank {shown(incident.get('first_diverging_rank'))} {'failed' if failed else 'diverged'} first{tie_note}"
    split = undecided(incident)
    if split:
        head = f"no rank named: {rank_span(split)} disagree, and nothing tells which is wrong ({undecided_note})"
    if job_wide(incident):
        head = f"no rank named: {job_wide(incident)} ({undecided_note})"
    if incident.get("detector") == "manual":
        head = f"no divergence named: bundles exported on an operator's request at step {shown(incident.get('step'))}"
    lines = [
        "",
        f"rankscope verdict: {head}",
        f"  detector : {shown(incident.get('detector'))}",
        f"  step     : {shown(incident.get('step'))}" + (_failed_step_note(ev) if failed else ""),
    ]
    if incident.get("token") is not None:
        lines.append(f"  token    : {incident['token']}  (forward call of the root model within the step)")
    if failed:
        lines.append(f"  how      : {what_of(incident)}")
        followers = ev.get("followers") or []
        if followers:
            lines.append("  followers: " + ", ".join(_follower(f) for f in followers) + "  (taken down after it)")
        others = ev.get("others") or []
        if others:
            # As last heard before the death: a follower listed above was still running then.
            # A follower's state is "lost" by now; its delay says it was alive when the cause died.
            delays = {f.get("rank"): f.get("delay_s") for f in followers}
            lines.append("  others   : when it died, " + ", ".join(_other(o, delays.get(o["rank"])) for o in others))
    else:
        lines.append(f"  tensor   : {incident.get('tensor') or '—'}")
    rule = _rule_text(incident.get("detector"), ev)
    if rule:
        lines.append(f"  rule     : {rule}")
    if ev.get("hint"):
        lines.append(f"  hint     : {ev['hint']}")
    if isinstance(ev.get("rerun"), dict):
        lines.append(f"  re-run   : {ev['rerun'].get('line')}")
    lines += [f"  also     : {_later(v)}" for v in _other_findings(incident)]
    if incident.get("dir"):
        lines.append(f"  incident : {incident['dir']}")
        lines.append(f"  report   : {incident['dir']}/report.html  (open it in a browser; it is self-contained)")
    bundles = incident.get("bundles") or {}
    if bundles:
        lines.append(f"  bundles  : {len(bundles)} rank bundle(s): "
                     + ", ".join(f"rank {r}" for r in sorted(bundles, key=lambda r: int(r))))
    return "\n".join(lines)


_OUTLIER_RULES = {"peer": "far from the other ranks' median", "history": "far from its own recent history"}


def _rule_text(detector: Any, ev: dict[str, Any]) -> str:
    """The rule as a sentence: an outlier's rule is a code (``peer``, ``history``)."""
    rule = ev.get("rule")
    if detector != "outlier" or not isinstance(rule, str):
        return str(rule or "")
    words = " and ".join(_OUTLIER_RULES[p] for p in rule.split("+") if p in _OUTLIER_RULES)
    ratio = ev.get("ratio_to_median")
    size = f" ({ratio:.3g}x the median {ev.get('value') or 'Norm'})" if isinstance(ratio, (int, float)) else ""
    return f"{rule}: {words}{size}" if words else rule


def _delay(d: Any) -> str:
    return "—" if d is None else f"+{float(d):.2f} s"


def _other(o: dict, died_after_s: float | None = None) -> str:
    started, last = o.get("started"), o.get("last_step")
    # A serving worker that ended its last batch began nothing after it.
    where = f"done with step {last}" if started is not None and last is not None and last >= started \
        else f"began step {shown(started)}"
    heard = o.get("heard_s")
    # What the coordinator last heard: worth a word only when it is not (nearly) the death's instant.
    stale = f", heard {heard:.1f} s before its death" if heard is not None and heard >= 0.05 else ""
    if died_after_s is not None and died_after_s >= 0:  # taken down after the cause
        return f"rank {o['rank']} alive ({where}{stale}; lost {float(died_after_s):.2f} s later)"
    return f"rank {o['rank']} {o['state']} ({where}{stale})"


def _follower(f: dict[str, Any]) -> str:
    how = f.get("signal") or (f"exit {f['exit_status']}" if f.get("exit_status") is not None else None)
    return f"rank {f['rank']} ({_delay(f.get('delay_s'))}{', ' + how if how else ''})"


def _other_findings(incident: dict[str, Any], most: int = 3) -> list[dict[str, Any]]:
    """Later verdicts filed under this incident that name another rank or detector."""
    seen = {(incident.get("detector"), incident.get("first_diverging_rank"))}
    split = bool(undecided(incident))
    out = []
    for v in incident.get("related_verdicts") or []:
        key = (v.get("detector"), v.get("rank"))
        if split and v.get("detector") == "replica" and v.get("tensor") == incident.get("tensor"):
            continue  # the same split seen again at a later step, naming another of its ranks
        if key not in seen and len(out) < most:
            seen.add(key)
            out.append(v)
    return out


def _later(v: dict[str, Any]) -> str:
    token = f", token {v['token']}" if v.get("token") is not None else ""
    # A value finding names its tensor; a crash or hang filed under an open incident says how
    # the rank failed, or the line would not say that it was a death at all.
    how = v.get("tensor") or (v.get("evidence") or {}).get("manner")
    where = f" ({how})" if how else ""
    return f"{shown(v.get('detector'))} names rank {shown(v.get('rank'))} at step {shown(v.get('step'))}{token}{where}"
