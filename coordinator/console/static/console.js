// The rankscope console: renders the coordinator's snapshots (an event stream) and sends
// the training controls. No framework and no CDN: clusters are often air-gapped.
"use strict";
(function () {
  const R = window.RANKSCOPE;
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k.nodeType ? k : String(k));
    return e;
  };
  const NONFINITE = 1e9;
  // Rows drawn per grid; more ranks than this are drawn in blocks (a block shows its worst rank).
  const MAX_ROWS = 256;
  let snap = null;
  const sel = {group: null, step: null, rank: null, tensor: null};

  // --- requests -----------------------------------------------------------------------
  async function api(path, body) {
    const opts = body === undefined ? {} : {method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json", "X-Rankscope-Token": R.token}};
    const resp = await fetch(path, opts);
    const data = await resp.json().catch(() => ({error: resp.statusText}));
    if (!resp.ok) throw new Error(data.error || resp.statusText);
    return data;
  }
  function notice(text, bad) {
    const n = $("notice");
    n.textContent = text;
    n.className = bad ? "bad" : "ok";
  }

  // --- colours ------------------------------------------------------------------------
  // As report.html's heatmap: a sequential scale from typical (white) to the grid's largest
  // finite deviation (at least 1, i.e. e-fold off), NaN/Inf red, no record grey. Replicas'
  // local gradients differ by nature: light blue is a healthy data-parallel job.
  function devColour(d, vmax) {
    if (d === null || d === undefined) return "#bdbdbd";
    if (d >= NONFINITE) return "#d62728";
    const t = Math.max(0, Math.min(1, d / (vmax || 1)));
    return mix([247, 251, 255], [8, 48, 107], Math.sqrt(t));
  }
  function mix(a, b, t) {
    return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * t)).join(",")})`;
  }
  function gridMax(data) {
    let m = 1;
    for (const col of data.deviation) for (const d of col) if (d !== null && d < NONFINITE && d > m) m = d;
    return m;
  }

  // --- snapshot -----------------------------------------------------------------------
  function render(s) {
    if (s.error) { $("state").textContent = "no answer"; $("state").className = "pill bad"; notice(s.error, true); return; }
    if (s.waiting) return;
    snap = s;
    const ranks = s.ranks || {};
    const states = {};
    for (const r of Object.values(ranks)) states[r.state] = (states[r.state] || 0) + 1;
    const overall = s.terminated ? "terminated" : states.paused ? "paused" : states.running ? "running"
      : Object.keys(states).length ? Object.keys(states).join("/") : "waiting for ranks";
    $("job").textContent = `job ${s.job || "(any)"}`;
    $("state").textContent = overall;
    $("state").className = "pill " + overall.replace(/[^a-z]/g, "");
    $("summary").textContent = `${Object.keys(ranks).length} ranks · ${s.peers || 0} agent(s) · last judged step ` +
      `${s.last_judged_step ?? "–"} · lag ${s.lag_steps ?? 0} step(s)`;
    $("rank-counts").textContent = Object.entries(states).map(([k, v]) => `${v} ${k}`).join(", ");
    $("layout").textContent = (s.layout_lines || []).join(" · ");
    $("coverage").textContent = (s.coverage_lines || []).join(" · ");
    const warns = $("warnings");
    warns.replaceChildren(...(s.warnings || []).map((w) => el("div", {class: "warn"}, "WARNING: " + w)));
    renderGrids(s.grid || {});
    renderRanks(ranks);
    renderVerdicts(s.verdicts || [], s.incidents || []);
    renderWatchpoints(s.watchpoints || [], s.sharded);
    if (!sel.group) {
      const g = Object.keys(s.grid || {})[0];
      if (g && s.grid[g].steps.length) pick(g, s.grid[g].steps.at(-1), null, false);
    }
  }

  function renderGrids(grid) {
    const box = $("grids");
    const groups = Object.keys(grid);
    $("grid-caption").textContent = groups.length ? "ranks × judged steps, newest right" : "no step judged yet";
    for (const g of groups) {
      const id = "grid-" + g.replace(/[^A-Za-z0-9_-]/g, "_");
      let fig = document.getElementById(id);
      if (!fig) {
        fig = el("figure", {id, class: "grid", "data-group": g},
          el("figcaption", {}, ""), el("canvas", {}));
        fig.querySelector("canvas").addEventListener("click", (ev) => gridClick(ev, g));
        box.append(fig);
      }
      drawGrid(fig, grid[g], g);
    }
  }

  function drawGrid(fig, data, g) {
    const nRanks = data.ranks.length, nSteps = data.steps.length;
    const block = Math.max(1, Math.ceil(nRanks / MAX_ROWS));
    const rows = Math.ceil(nRanks / block);
    const cw = Math.max(4, Math.min(16, Math.floor(900 / Math.max(1, nSteps))));
    const ch = Math.max(2, Math.min(16, Math.floor(480 / Math.max(1, rows))));
    const c = fig.querySelector("canvas");
    c.width = Math.max(1, nSteps * cw); c.height = Math.max(1, rows * ch);
    c.dataset.cw = cw; c.dataset.ch = ch; c.dataset.block = block;
    const ctx = c.getContext("2d");
    const vmax = gridMax(data);
    let filled = 0;
    for (let j = 0; j < nSteps; j++) {
      const col = data.deviation[j];
      for (let row = 0; row < rows; row++) {
        let worst = null;
        for (let i = row * block; i < Math.min(nRanks, (row + 1) * block); i++) {
          const d = col[i];
          if (d !== null && (worst === null || d > worst)) worst = d;
        }
        if (worst !== null) filled++;
        ctx.fillStyle = devColour(worst, vmax);
        ctx.fillRect(j * cw, row * ch, cw - (cw > 4 ? 1 : 0), ch - (ch > 3 ? 1 : 0));
      }
    }
    // Where a verdict named a rank: outlined, as the report outlines it.
    ctx.strokeStyle = "#c0392b"; ctx.lineWidth = 2;
    for (const v of (snap && snap.verdicts) || []) {
      const j = v.group === g ? data.steps.indexOf(v.step) : -1, i = data.ranks.indexOf(v.rank);
      if (j >= 0 && i >= 0) ctx.strokeRect(j * cw + 1, Math.floor(i / block) * ch + 1, Math.max(1, cw - 3), Math.max(1, ch - 3));
    }
    if (sel.group === g && sel.step !== null) {
      const j = data.steps.indexOf(sel.step);
      if (j >= 0) { ctx.strokeStyle = "#000"; ctx.lineWidth = 2; ctx.strokeRect(j * cw + 1, 1, cw - 2, c.height - 2); }
    }
    c.dataset.filled = filled;
    c.dataset.vmax = vmax;
    fig.dataset.steps = nSteps; fig.dataset.ranks = nRanks; fig.dataset.filled = filled;
    fig.querySelector("figcaption").textContent = `${g}: ${nRanks} ranks` +
      (block > 1 ? ` in blocks of ${block}` : "") +
      (nSteps ? `, steps ${data.steps[0]}–${data.steps.at(-1)}` : "");
  }

  function gridClick(ev, g) {
    const c = ev.currentTarget, data = snap.grid[g];
    const rect = c.getBoundingClientRect();
    const x = (ev.clientX - rect.left) * c.width / rect.width, y = (ev.clientY - rect.top) * c.height / rect.height;
    const j = Math.floor(x / c.dataset.cw), row = Math.floor(y / c.dataset.ch), block = +c.dataset.block;
    if (j < 0 || j >= data.steps.length) return;
    let rank = null, worst = -1;
    for (let i = row * block; i < Math.min(data.ranks.length, (row + 1) * block); i++) {
      const d = data.deviation[j][i];
      if (d !== null && d > worst) { worst = d; rank = data.ranks[i]; }
    }
    pick(g, data.steps[j], rank, true);
  }

  function renderRanks(ranks) {
    const body = $("rank-table").tBodies[0];
    const rows = Object.entries(ranks).sort((a, b) => +a[0] - +b[0]).slice(0, 4096);
    body.replaceChildren(...rows.map(([r, v]) => el("tr", {"data-rank": r, class: v.state || ""},
      el("td", {}, r), el("td", {}, v.state ?? "–"), el("td", {}, v.step ?? "–"), el("td", {}, v.lag ?? 0))));
  }

  function renderVerdicts(verdicts, incs) {
    $("no-verdicts").hidden = verdicts.length > 0;
    const state = Object.fromEntries(incs.map((i) => [i.incident_id, i.state]));
    const body = $("verdict-table").tBodies[0];
    const rows = [...verdicts].reverse().map((v) => {
      const who = v.decided === false ? `undecided: ${(v.candidates || []).join(", ")}` : v.rank;
      const rule = typeof v.rule === "object" && v.rule !== null ? JSON.stringify(v.rule) : (v.rule || "");
      const tr = el("tr", {"data-incident": v.incident_id || "", "data-detector": v.detector, class: "verdict", title: rule},
        el("td", {}, v.incident_id || "–"), el("td", {class: "detector"}, v.detector), el("td", {class: "rank"}, who),
        el("td", {class: "step"}, v.step), el("td", {class: "tensor"}, v.tensor ?? "–"),
        el("td", {}, state[v.incident_id] ?? "–"),
        el("td", {}, v.report_url ? el("a", {href: v.report_url, target: "_blank"}, "report") : "–"));
      tr.addEventListener("click", (ev) => {
        if (ev.target.tagName === "A") return;
        pick(v.group, v.step, v.decided === false ? null : v.rank, true, v.tensor);
      });
      return tr;
    });
    body.replaceChildren(...rows);
  }

  // --- model tree ---------------------------------------------------------------------
  async function pick(group, step, rank, load, tensor) {
    Object.assign(sel, {group, step, rank});
    if (snap) renderGrids(snap.grid || {});
    if (!load && document.querySelector("#tree-list li")) return;
    try {
      const t = await api(`/api/tensors?group=${encodeURIComponent(group)}&step=${step}`);
      renderTree(t, step);
      if (t) sel.step = t.step;  // the step asked for may be older than the coordinator keeps
      if (tensor) showTensor(tensor);
    } catch (e) { notice(e.message, true); }
  }

  function renderTree(t, wanted) {
    const list = $("tree-list");
    if (!t) { $("tree-caption").textContent = "no step kept (with ingest shards the steps stay in the shards)"; list.replaceChildren(); return; }
    $("tree-caption").textContent = `${t.group} step ${t.step}` + (t.step !== wanted ? ` (step ${wanted} is no longer kept; kept: ${t.steps.join(", ")})` : "") +
      ` · ${t.tensors.length} tensors`;
    const treeMax = Math.max(1, ...t.tensors.map((x) => x.deviation).filter((d) => d !== null && d < NONFINITE));
    const root = {kids: new Map(), worst: null, leaves: []};
    for (const x of t.tensors) {
      let node = root;
      for (const part of x.name.split(".").slice(0, -1)) {
        if (!node.kids.has(part)) node.kids.set(part, {kids: new Map(), worst: null, leaves: []});
        node = node.kids.get(part);
        if (x.deviation !== null && (node.worst === null || x.deviation > node.worst)) node.worst = x.deviation;
      }
      node.leaves.push(x);
    }
    const build = (node) => {
      const items = [];
      for (const [name, kid] of node.kids) {
        const det = el("details", {open: ""}, el("summary", {}, el("span", {class: "sw", style: `background:${devColour(kid.worst, treeMax)}`}), name));
        det.append(el("ul", {}, ...build(kid)));
        items.push(el("li", {class: "node"}, det));
      }
      for (const x of node.leaves) {
        items.push(el("li", {class: "leaf", "data-name": x.name, title: x.name, onclick: () => showTensor(x.name)},
          el("span", {class: "sw", style: `background:${devColour(x.deviation, treeMax)}`}), x.name.split(".").at(-1),
          el("small", {class: "muted"}, ` ${x.kind ?? ""}` + (x.rank !== null && x.deviation > 0 ? `, furthest off: rank ${x.rank}` : ""))));
      }
      return items;
    };
    list.replaceChildren(...build(root));
    filterTree();
  }

  function filterTree() {
    const q = $("tree-search").value.trim().toLowerCase();
    for (const li of document.querySelectorAll("#tree-list li.leaf"))
      li.hidden = q !== "" && !li.dataset.name.toLowerCase().includes(q);
    for (const li of [...document.querySelectorAll("#tree-list li.node")].reverse())
      li.hidden = q !== "" && !li.querySelector("li.leaf:not([hidden])");
  }

  // --- tensor view --------------------------------------------------------------------
  async function showTensor(name) {
    sel.tensor = name;
    const q = `group=${encodeURIComponent(sel.group)}&tensor=${encodeURIComponent(name)}&step=${sel.step}` +
      (sel.rank !== null ? `&ranks=${sel.rank}` : "");
    try { renderTensor(await api(`/api/tensor?${q}`)); } catch (e) { notice(e.message, true); }
  }

  function renderTensor(w) {
    const body = $("tensor-body");
    if (!w) { $("tensor-caption").textContent = `${sel.tensor}: not in the kept steps`; body.replaceChildren(); return; }
    $("tensor-caption").textContent = `${w.tensor} (${w.kind ?? "?"}) on ${w.ranks.length} of ${w.ranks_in_group} ranks`;
    const fi = (f) => w.fields.indexOf(f);
    const recs = w.values.flat().filter((r) => r !== null);
    // Only the statistics this tensor has: the default watch keeps a gradient's norm and a
    // weight's fingerprint, not their Max/Min/Mean (wire.records.STAT_COLUMNS).
    const STATS = ["Max", "Min", "Mean", "Norm"].filter((f) => fi(f) >= 0 && recs.some((r) => r[fi(f)] !== null && r[fi(f)] !== "nan"));
    const hasStats = STATS.length > 0;
    const hasPrint = fi("crc32") >= 0 && recs.some((r) => r[fi("crc32")] !== null);
    if (hasPrint) STATS.push("crc32");
    const chosen = $("tensor-stat") && STATS.includes($("tensor-stat").value) ? $("tensor-stat").value : null;
    const stat = chosen || (hasStats ? (STATS.includes("Norm") ? "Norm" : STATS[0]) : hasPrint ? "crc32" : "Norm");
    const head = el("tr", {}, el("th", {}, "rank"), ...w.steps.map((s) => el("th", {}, `step ${s}`)));
    const cell = (rec) => rec === null ? "–" : stat === "crc32" ? (rec[fi(stat)] ?? "–") : fmt(rec[fi(stat)]);
    const rows = w.ranks.map((r, i) => el("tr", {"data-rank": r}, el("th", {}, r), ...w.values[i].map((rec) => el("td", {}, cell(rec)))));
    const med = stat === "crc32" ? el("tr", {class: "median"}, el("th", {}, "ranks alike"), ...w.steps.map((_, j) => {
      const seen = {};
      for (const row of w.values) if (row[j] !== null && row[j][fi(stat)] !== null) seen[row[j][fi(stat)]] = (seen[row[j][fi(stat)]] || 0) + 1;
      const counts = Object.values(seen).sort((a, b) => b - a);
      return el("td", {class: counts.length > 1 ? "split" : ""}, counts.length ? counts.join(" / ") : "–");
    })) : el("tr", {class: "median"}, el("th", {}, "median"), ...w.median.map((m) => el("td", {}, m === null ? "–" : fmt(m[fi(stat)]))));
    const pickStat = el("select", {id: "tensor-stat", onchange: () => renderTensor(w)},
      ...STATS.map((f) => el("option", f === stat ? {selected: ""} : {}, f)));
    const a = el("select", {id: "diff-a"}, ...w.ranks.map((r) => el("option", {}, r)));
    const b = el("select", {id: "diff-b"}, ...w.ranks.map((r, i) => el("option", i === 1 ? {selected: ""} : {}, r)));
    const diff = el("table", {id: "diff-table", class: "heat"});
    const drawDiff = () => {
      const ia = w.ranks.indexOf(+a.value), ib = w.ranks.indexOf(+b.value);
      const rows2 = STATS.map((f) => {
        if (f === "crc32") {
          return el("tr", {}, el("th", {}, "fingerprint"), ...w.steps.map((_, j) => {
            const x = w.values[ia][j], y = w.values[ib][j];
            const same = x === null || y === null || x[fi(f)] === null || y[fi(f)] === null ? null : x[fi(f)] === y[fi(f)];
            return el("td", {class: same === false ? "split" : ""}, same === null ? "–" : same ? "same" : "differs");
          }));
        }
        const ds = w.steps.map((_, j) => {
          const x = w.values[ia][j], y = w.values[ib][j];
          return x === null || y === null ? null : num(x[fi(f)]) - num(y[fi(f)]);
        });
        const top = Math.max(1e-30, ...ds.filter((d) => d !== null && isFinite(d)).map(Math.abs));
        return el("tr", {}, el("th", {}, f), ...ds.map((d) => el("td", {style: d === null ? "" :
          `background:${d === 0 ? "#fff" : mix([255, 255, 255], d > 0 ? [198, 40, 40] : [21, 101, 192], Math.min(1, Math.abs(d) / top))}`}, d === null ? "–" : fmt(d))));
      });
      diff.replaceChildren(el("tr", {}, el("th", {}, `rank ${a.value} − rank ${b.value}`), ...w.steps.map((s) => el("th", {}, `step ${s}`))), ...rows2);
    };
    a.onchange = b.onchange = drawDiff;
    body.replaceChildren(
      el("p", {}, "statistic ", pickStat),
      el("table", {id: "tensor-table"}, head, ...rows, med),
      stat === "crc32" ? el("p", {class: "muted"}, "The default watch keeps each weight's fingerprint (bit-exact), not its statistics: replicas must agree; --watch full records Max/Min/Mean/Norm.") : curve(w, fi(stat)),
      el("p", {}, "difference ", a, " − ", b), diff, el("div", {id: "capture-box"}));
    if (w.ranks.length > 1) drawDiff();
    window.RANKSCOPE_VALUES.mount($("capture-box"), {tensor: w.tensor, ranks: w.ranks, api, el, notice, fmt, mix});
  }

  function curve(w, k) {
    const W = 520, H = 160, pts = [];
    for (const row of w.values) pts.push(row.map((rec) => rec === null ? null : num(rec[k])));
    const all = pts.flat().filter((v) => v !== null && isFinite(v));
    if (!all.length) return el("p", {class: "muted"}, "nothing finite to draw");
    const lo = Math.min(...all), hi = Math.max(...all), span = hi - lo || 1;
    const x = (j) => 30 + j * (W - 40) / Math.max(1, w.steps.length - 1), y = (v) => H - 20 - (v - lo) * (H - 40) / span;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("id", "tensor-curve");
    pts.forEach((row, i) => {
      const d = row.map((v, j) => v === null || !isFinite(v) ? "" : `${x(j)},${y(v)}`).filter(Boolean).join(" ");
      const p = document.createElementNS(ns, "polyline");
      p.setAttribute("points", d); p.setAttribute("fill", "none");
      p.setAttribute("stroke", w.ranks[i] === sel.rank ? "#c62828" : "#607d8b");
      p.setAttribute("stroke-width", w.ranks[i] === sel.rank ? 2.5 : 1);
      svg.append(p);
    });
    return svg;
  }
  const num = (v) => typeof v === "number" ? v : v === "nan" ? NaN : v === "inf" ? Infinity : v === "-inf" ? -Infinity : NaN;
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    const x = num(v);
    if (!isFinite(x)) return String(v);
    return Math.abs(x) >= 1e4 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(3) : x.toPrecision(5);
  }

  // --- watchpoints --------------------------------------------------------------------
  function setupWatchpoints() {
    const cond = $("wp-condition");
    cond.replaceChildren(...Object.keys(R.conditions).map((c) => el("option", {value: c}, c)));
    const params = () => {
      const ps = R.conditions[cond.value];
      $("wp-param").replaceChildren(...ps.map((p) => el("option", {value: p}, p)));
      $("wp-param").hidden = $("wp-value").hidden = ps.length === 0;
    };
    cond.onchange = params; params();
    $("wp-recheck").addEventListener("click", recheck);
    $("wp-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const rule = {condition: cond.value};
      if (!$("wp-param").hidden) rule[$("wp-param").value] = Number($("wp-value").value);
      const names = $("wp-names").value.trim();
      if (names) rule.names = [names];
      await setRules([...current(), rule], "watchpoint added: applied from the next judged step on every rank");
    });
  }
  async function recheck() {
    try {
      const a = await api("/api/recheck", {});
      const span = a.steps ? `steps ${a.steps[0]}-${a.steps[1]}` : "no kept step";
      notice(`rechecked ${a.checked} kept step(s) (${span}): ${a.hits.length}${a.more ? "+" + a.more : ""} hit(s)`);
      $("wp-rechecked").replaceChildren(...a.hits.map((h) => el("li", {class: "hit", title: "show this step and tensor",
        onclick: () => pick(h.group, h.step, h.rank, true, h.tensor)},
        `step ${h.step} rank ${h.rank} ${h.tensor || ""}: ${h.condition} ${h.parameter || ""} ` +
        `${fmt(h.actual)}${h.threshold === null || h.threshold === undefined ? "" : " vs " + fmt(h.threshold)}`)));
    } catch (e) { notice(`recheck: ${e.message}`, true); }
  }
  const current = () => (snap && snap.watchpoints || []).map((w) => { const r = {...w}; delete r.id; delete r.blind; return r; });
  async function setRules(rules, said) {
    try { const a = await api("/api/watchpoints", {rules}); if (snap) snap.watchpoints = a.watchpoints; renderWatchpoints(a.watchpoints); notice(said); }
    catch (e) { notice(e.message, true); }
  }
  function renderWatchpoints(wps, sharded) {
    $("wp-form").hidden = !!sharded || R.readOnly;
    $("wp-recheck-row").hidden = !!sharded || !wps.length;
    $("wp-list").replaceChildren(...wps.map((w, i) => el("li", {"data-id": w.id},
      `${w.condition} ` + Object.entries(w).filter(([k]) => !["id", "condition", "kinds", "names", "blind"].includes(k)).map(([k, v]) => `${k}=${v}`).join(" ") +
      (w.names && w.names.length ? ` on ${w.names.join(", ")}` : "") + ` (${(w.kinds || []).join(", ")})`,
      R.readOnly ? null : el("button", {onclick: () => setRules(current().filter((_, j) => j !== i), "watchpoint removed")}, "Remove"),
      w.blind ? el("div", {class: "warn"}, w.blind) : null)));
  }

  // --- controls -----------------------------------------------------------------------
  function setupControls() {
    for (const b of document.querySelectorAll("#controls button")) {
      if (R.readOnly) { b.disabled = true; b.title = "read-only console"; continue; }
      b.addEventListener("click", async () => {
        const verb = b.dataset.verb, body = {};
        if (verb === "step") body.n = Math.max(1, parseInt($("step-n").value, 10) || 1);
        if (verb === "terminate") {
          if (!window.confirm("Terminate the job on every rank? It cannot be resumed.")) return;
          body.confirm = true;
        }
        try {
          const a = await api(`/api/control/${verb}`, body);
          notice(`${verb}${body.n ? " " + body.n : ""} sent to ${a.sent_to_agents} node agent(s)` + (a.dir ? ` → ${a.dir}` : ""));
        } catch (e) { notice(`${verb}: ${e.message}`, true); }
      });
    }
  }

  // --- start --------------------------------------------------------------------------
  $("tree-search").addEventListener("input", filterTree);
  setupControls();
  setupWatchpoints();
  const stream = new EventSource("/api/events");
  stream.onmessage = (ev) => render(JSON.parse(ev.data));
  stream.onerror = () => { $("state").textContent = "disconnected"; $("state").className = "pill bad"; };
})();
