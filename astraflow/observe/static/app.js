// The dashboard page: poll /api/state, draw with Plotly (no framework needed).
// The page sends the state it holds (`since`); the server answers "unchanged" until the
// store holds something new, and then only the points added since (`delta`), which the
// page appends with Plotly.extendTraces: an open page costs nothing between a run's
// commits, and a commit costs what its new points cost, not a redraw of every curve.
// A first answer, or one after the server thinned a curve further, is drawn whole.
"use strict";
const POLL_MS = Number(document.body.dataset.pollMs) || 2500;
const LAYOUT = { margin: { l: 48, r: 12, t: 32, b: 40 },
                 legend: { orientation: "h", x: 1, xanchor: "right", y: 1.0, yanchor: "bottom",
                           bgcolor: "rgba(255,255,255,0)" },
                 font: { size: 11 } };

function chart(id, title) {
  let el = document.getElementById(id);
  if (!el) {
    el = document.createElement("div");
    el.id = id; el.className = "chart"; el.dataset.points = "0";
    document.getElementById("charts").appendChild(el);
  }
  return el;
}

function draw(id, title, traces, xtitle, ytitle) {
  const el = chart(id, title);
  Plotly.react(el, traces, { ...LAYOUT, title: { text: title, x: 0.01, xanchor: "left", font: { size: 13 } },
    xaxis: { title: { text: xtitle } }, yaxis: { title: { text: ytitle } } },
    { displaylogo: false, responsive: true });
  count(el);
}

// Tests and scripts wait on this: the number of points of the chart's first curve.
function count(el) {
  el.dataset.points = String(el.data && el.data.length ? el.data[0].x.length : 0);
}

// Append the new points of each trace (in the order `draw` was given them).
function extend(id, parts) {
  const el = document.getElementById(id);
  const idx = parts.map((_, i) => i).filter((i) => parts[i].x.length);
  if (!el || !idx.length) return;
  Plotly.extendTraces(el, { x: idx.map((i) => parts[i].x), y: idx.map((i) => parts[i].y) }, idx);
  count(el);
}

const fmt = (v, d = 3) => (v === null || v === undefined) ? "—" : Number(v).toFixed(d);
const esc = (s) => String(s).replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" }[c]));

function render(s) {
  document.getElementById("title").textContent = `AstraFlow · ${s.flow} (${s.mode})`;
  document.getElementById("store").textContent = s.store;
  stamp(s.refreshed_at);
  const audit = document.getElementById("audit");
  audit.textContent = s.audit.verdict;
  audit.className = s.audit.verdict === "OK" ? "ok" : (s.audit.verdict === "pending" ? "" : "bad");

  const cards = [];
  const staleness = [], waits = [];
  for (const [p, d] of Object.entries(s.policies)) {
    const m = d.summary;
    cards.push(`<div class="card" id="card-${p}"><b>${esc(p)}</b> step ${m.step ?? "—"} ·
      v${m.version ?? "—"}<br>reward ${fmt(m.reward)} · held-out ${m.heldout === null ? "—" :
      (100 * m.heldout).toFixed(1) + "%"}<br>${fmt(m.rows_per_s, 1)} rows/s · staleness
      ${fmt(m.staleness, 2)} · trainer wait ${m.trainer_wait === null ? "—" :
      Math.round(100 * m.trainer_wait) + "%"} · not started ${m.rows_not_started} · fed
      ${m.rows_fed}</div>`);
    if (s.delta) extend(`reward-${p}`, [d.reward, d.heldout]);
    else draw(`reward-${p}`, `${p}`, [
      { x: d.reward.x, y: d.reward.y, name: "train reward (trainer step)", mode: "lines" },
      { x: d.heldout.x, y: d.heldout.y, name: "held-out (weight version)", mode: "lines+markers",
        xaxis: "x", yaxis: "y" },
    ], "trainer step / version", "reward / accuracy");
    staleness.push({ x: d.staleness.x, y: d.staleness.y, name: p, mode: "lines" });
    waits.push({ x: d.trainer_wait.x, y: d.trainer_wait.y, name: p, mode: "lines" });
  }
  document.getElementById("cards").innerHTML = cards.join("");
  if (s.delta) {
    extend("staleness", staleness);
    extend("trainer-wait", waits);
  } else {
    draw("staleness", "staleness (versions behind, mean per step)", staleness, "trainer step", "versions");
    draw("trainer-wait", "trainer wait per step", waits, "trainer step", "seconds");
  }
  draw("workers", "workers per pool (committed rows in each 5 s)",
       Object.entries(s.pools).map(([pool, d]) => ({ x: d.t, y: d.n, name: pool,
         mode: "lines", line: { shape: "hv" } })), "seconds since the run's first record", "workers");

  document.querySelector("#episodes tbody").innerHTML = s.episodes.map((e) =>
    `<tr><td>${esc(e.policy)}</td><td>${e.version}</td><td>${fmt(e.reward, 2)}</td>
     <td>${esc(e.finish)}</td><td>${esc(e.worker)}</td><td class="text">${esc(e.prompt)}</td>
     <td class="text">${esc(e.completion)}</td></tr>`).join("");
  document.body.dataset.refreshes = String(s.refreshes);
  // Tests wait on this: how many answers were appended rather than drawn whole.
  if (s.delta) document.body.dataset.deltas = String(Number(document.body.dataset.deltas || 0) + 1);
}

function stamp(refreshedAt) {
  document.getElementById("updated").textContent =
    "store read " + new Date(refreshedAt * 1000).toLocaleTimeString();
}

let seq = null;  // the state this page shows
async function tick() {
  try {
    const r = await fetch("/api/state" + (seq === null ? "" : `?since=${seq}`),
                          { cache: "no-store" });
    if (r.ok) {
      const s = await r.json();
      if (s.unchanged) stamp(s.refreshed_at);
      else { render(s); seq = s.seq; }
    }
  } catch (err) {
    document.getElementById("updated").textContent = "dashboard server unreachable";
  }
  setTimeout(tick, POLL_MS);
}
tick();
