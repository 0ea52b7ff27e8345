// The tensor view's element values: "capture this tensor at the next step on these ranks",
// then a window of one 2-D slice on two ranks and their difference as a heat map. The
// ranks answer after their next step (on a paused job: after Step), so the page polls the
// capture until every rank named has answered.
"use strict";
(function () {
  let timer = null;

  function mount(box, ctx) {
    const {el, api, notice} = ctx;
    const ranks = el("input", {id: "capture-ranks", type: "text", size: 10, value: ctx.ranks.slice(0, 2).join(","),
      title: "rank ids, comma-separated"});
    const go = el("button", {id: "capture-go", type: "button"}, "Capture values");
    if (window.RANKSCOPE.readOnly) go.disabled = true;
    const out = el("div", {id: "capture-out"});
    go.addEventListener("click", async () => {
      const want = ranks.value.split(",").map((s) => s.trim()).filter(Boolean).map(Number);
      try {
        const a = await api("/api/capture", {tensor: ctx.tensor, ranks: want});
        notice(`capture ${a.capture}: ${a.tensor} at the next step on rank(s) ${a.ranks.join(", ")}`);
        follow(a.capture, out, ctx, {});
      } catch (e) { notice(`capture: ${e.message}`, true); }
    });
    box.replaceChildren(
      el("p", {}, "values: capture this tensor at the next step on ranks ", ranks, " ", go),
      el("p", {class: "muted"}, "On a paused job, press Step to run that step. Each rank saves the tensor whole " +
        "beside its local dump and sends its first 262,144 values."), out);
  }

  function follow(id, out, ctx, view) {
    clearTimeout(timer);
    const tick = async () => {
      const q = [`id=${encodeURIComponent(id)}`];
      for (const k of ["a", "b", "row", "col"]) if (view[k] !== undefined) q.push(`${k}=${view[k]}`);
      if (view.index && view.index.length) q.push(`index=${view.index.join(",")}`);
      let c;
      try { c = await ctx.api(`/api/capture?${q.join("&")}`); } catch (e) {
        out.replaceChildren(ctx.el("p", {class: "bad"}, `capture ${id}: ${e.message}`)); return;
      }
      draw(c, out, ctx, view, (v) => follow(id, out, ctx, v));
      if (c.waiting.length) timer = setTimeout(tick, 1000);
    };
    tick();
  }

  function draw(c, out, ctx, view, again) {
    const {el, fmt, mix} = ctx;
    const parts = Object.entries(c.answers).map(([r, a]) => a.error ?
      el("li", {class: "bad"}, `rank ${r}: ${a.error}`) :
      el("li", {}, `rank ${r}: step ${a.step}, shape [${a.shape.join(", ")}], ${a.dtype}` +
        (a.sent < a.numel ? `, first ${a.sent} of ${a.numel} values sent` : "") + (a.path ? ` (whole in ${a.path})` : "")));
    if (c.waiting.length) parts.push(el("li", {class: "muted"}, `waiting for rank(s) ${c.waiting.join(", ")}: ` +
      "their next step has not ended"));
    const kids = [el("p", {}, `capture ${c.id} of ${c.tensor}`), el("ul", {id: "capture-answers"}, ...parts)];
    const w = c.window;
    if (w) {
      const answered = Object.entries(c.answers).filter(([, a]) => !a.error).map(([r]) => +r);
      const pick = (id, chosen) => el("select", {id}, ...answered.map((r) => el("option", r === chosen ? {selected: ""} : {}, r)));
      const a = pick("capture-a", w.a.rank), b = w.b ? pick("capture-b", w.b.rank) : null;
      const idx = w.slices.map((d, i) => el("input", {type: "number", min: 0, max: d - 1, value: w.index[i],
        class: "capture-index", title: `index ${i} of ${d}`}));
      const row = el("input", {id: "capture-row", type: "number", min: 0, value: w.rows[0]});
      const col = el("input", {id: "capture-col", type: "number", min: 0, value: w.cols[0]});
      const show = el("button", {type: "button", id: "capture-show"}, "Show");
      const read = () => ({a: +a.value, b: b ? +b.value : undefined, index: idx.map((i) => +i.value), row: +row.value, col: +col.value});
      show.addEventListener("click", () => again(read()));
      kids.push(el("p", {}, "rank ", a, b ? " and rank " : "", b,
        ...(idx.length ? [" slice [", ...idx.flatMap((i, k) => k ? [", ", i] : [i]), ", :, :]"] : []),
        " from row ", row, " column ", col, " ", show));
      if (w.b) {
        const where = w.largest_at;
        const jump = where ? el("button", {type: "button", id: "capture-jump"}, "show it") : null;
        if (jump) jump.addEventListener("click", () => {
          const n = where.length, lead = where.slice(0, Math.max(0, n - 2));
          const r = n >= 2 ? where[n - 2] : 0, k = n >= 1 ? where[n - 1] : 0;
          again({...read(), index: lead, row: Math.max(0, r - 8), col: Math.max(0, k - 8)});
        });
        kids.push(el("p", {id: "capture-summary", class: w.differing ? "bad" : ""},
          `${w.differing} of ${w.compared} values differ between rank ${w.a.rank} and rank ${w.b.rank}`,
          where ? `; the largest, |a − b| = ${fmt(w.largest)}, at [${where.join(", ")}] ` : "", jump));
      }
      const head = (label) => el("tr", {}, el("th", {}, label), ...range(w.cols).map((j) => el("th", {}, j)));
      const table = (id, label, grid, colour) => el("table", {id, class: "values"}, head(label),
        ...grid.map((r, i) => el("tr", {}, el("th", {}, w.rows[0] + i), ...r.map((v) => el("td",
          colour ? {style: `background:${colour(v)}`} : {}, v === null ? "·" : fmt(v))))));
      kids.push(table("capture-values-a", `rank ${w.a.rank}`, w.a.values, null));
      if (w.b) {
        kids.push(table("capture-values-b", `rank ${w.b.rank}`, w.b.values, null));
        const finite = w.diff.flat().filter((d) => typeof d === "number");
        const top = Math.max(1e-30, ...finite.map(Math.abs));
        const heat = (d) => d === null ? "#eee" : typeof d !== "number" ? "#d62728" : d === 0 ? "#fff" :
          mix([255, 255, 255], d > 0 ? [198, 40, 40] : [21, 101, 192], Math.min(1, Math.abs(d) / top));
        kids.push(table("capture-diff", `rank ${w.a.rank} − rank ${w.b.rank}`, w.diff, heat));
      }
    }
    out.replaceChildren(...kids);
  }

  function range([lo, hi]) {
    const out = [];
    for (let i = lo; i < hi; i++) out.push(i);
    return out;
  }

  window.RANKSCOPE_VALUES = {mount};
})();
