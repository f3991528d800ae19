// Jobs page: poll /ui/jobs.json every 2 s and redraw the table. Text goes in through
// textContent only, so no job field is ever parsed as HTML.
"use strict";
(function () {
  const table = document.getElementById("jobs");
  if (!table) return;
  const body = table.tBodies[0];
  const status = document.getElementById("poll-status");
  const limit = table.dataset.limit || "100";

  function cell(row, text, cls) {
    const td = row.insertCell();
    if (text instanceof Node) td.appendChild(text); else td.textContent = text == null ? "" : String(text);
    if (cls) td.className = cls;
    return td;
  }
  function span(text, cls) { const s = document.createElement("span"); s.textContent = text; s.className = cls; return s; }
  function us(x) { return x == null ? "–" : x.toLocaleString(undefined, {minimumFractionDigits: 2, maximumFractionDigits: 2}) + " µs"; }

  function draw(jobs) {
    const rows = document.createDocumentFragment();
    for (const j of jobs) {
      const tr = document.createElement("tr");
      tr.dataset.id = j.id;
      tr.dataset.state = j.state;
      cell(tr, j.id);
      const st = document.createElement("span");
      st.appendChild(span(j.state, "state state-" + j.state));
      if (j.cache_hit) { st.appendChild(document.createTextNode(" ")); st.appendChild(span("cache hit", "tag")); }
      cell(tr, st);
      cell(tr, j.program).title = j.hash;
      cell(tr, j.target);
      if (j.error) cell(tr, span(j.error, "error"));
      else cell(tr, j.phase ? j.phase + ": " + (j.states || 0) + " states, " + (j.verified || 0) + " verified" : "");
      cell(tr, us(j.best_time_us));
      cell(tr, j.speedup == null ? "–" : j.speedup.toFixed(2) + "×");
      if (j.kernel_id != null) {
        const a = document.createElement("a");
        a.href = "/ui/kernels/" + encodeURIComponent(j.kernel_id);
        a.textContent = "kernel " + j.kernel_id;
        cell(tr, a);
      } else cell(tr, "");
      cell(tr, j.created_at);
      rows.appendChild(tr);
    }
    if (!jobs.length) return;
    body.replaceChildren(rows);
  }

  async function poll() {
    try {
      const res = await fetch("/ui/jobs.json?limit=" + encodeURIComponent(limit), {credentials: "same-origin"});
      if (!res.ok) throw new Error("HTTP " + res.status);
      draw((await res.json()).jobs);
      status.textContent = "Updated " + new Date().toLocaleTimeString() + ".";
    } catch (e) {
      status.textContent = "Update failed (" + e.message + "); retrying.";
    }
    setTimeout(poll, 2000);
  }
  setTimeout(poll, 2000);
})();
