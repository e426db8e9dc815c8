// shared by the relay's and the bootstrap server's pages (src/databus/serving/ui.py
// inserts this file where a page's script says so: one inline script, as the CSP wants)
"use strict";
const PERIOD_MS = 2000;        // how often the page asks its server
const KEEP_S = 3600;           // chart history kept in the browser
const BEHIND_S = 5;            // this many seconds behind is marked
const errors = [];             // [[unix seconds, text], ...], newest first
const $ = (id) => document.getElementById(id);

// no secrets on screen: the user-info of any URL is blanked out
function clean(v) {
  return String(v ?? "").replace(/\/\/[^\/\s@]*@/g, "//***@");
}
function text(el, v, cls) {
  el.textContent = clean(v);
  if (cls !== undefined) el.className = cls;
}
function noteError(what) {
  const msg = clean(what);
  if (errors.length && errors[0][1] === msg) return;
  errors.unshift([Date.now() / 1000, msg]);
  errors.length = Math.min(errors.length, 20);
}
async function getJSON(path) {
  // relative: works under a reverse proxy's path prefix; same-origin credentials only
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store",
                               headers: {"Accept": "application/json"}});
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  return {status: r.status, body: body};
}

// a line of [unix seconds, seconds behind] points over at most KEEP_S, as inline SVG
function chart(points, W, H) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const now = Date.now() / 1000;
  const t0 = Math.max(points.length ? points[0][0] : now, now - KEEP_S);
  const span = Math.max(now - t0, 60);  // at least a minute wide
  const top = Math.max(1, ...points.map(p => p[1]));
  const xy = points.map(p => [((p[0] - (now - span)) / span) * (W - 2) + 1,
                              H - 12 - (p[1] / top) * (H - 16)]);
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", top >= BEHIND_S ? "#c77700" : "#2a6fdb");
  line.setAttribute("stroke-width", "1.5");
  line.setAttribute("points", xy.map(p => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "));
  svg.appendChild(line);
  const label = document.createElementNS(NS, "text");
  label.setAttribute("x", 2); label.setAttribute("y", H - 2);
  label.setAttribute("font-size", "10"); label.setAttribute("fill", "#777");
  label.textContent = `max ${top.toFixed(1)} s over ${(span / 60).toFixed(0)} min`;
  svg.appendChild(label);
  return svg;
}

function showReady(el, ready) {
  const ok = ready.status === "ready";
  const why = (ready.checks || []).filter(c => !c.ok).map(c => c.name + ": " + c.detail);
  text(el, ok ? "ready" : "NOT READY " + why.join("; "), ok ? "ok" : "bad");
  why.forEach(noteError);
}

function showErrors() {
  const ul = $("errors");
  ul.replaceChildren();
  if (!errors.length) {
    const li = document.createElement("li");
    li.className = "muted"; li.textContent = "none";
    ul.appendChild(li);
  }
  for (const [t, msg] of errors) {
    const li = document.createElement("li");
    li.textContent = new Date(t * 1000).toLocaleTimeString() + "  " + msg;
    ul.appendChild(li);
  }
}

function showStatus(problems) {
  problems.forEach(noteError);
  showErrors();
  text($("status"), (problems.length ? "could not read everything; " : "") +
       "updated " + new Date().toLocaleTimeString() + ", every " + PERIOD_MS / 1000 + " s",
       problems.length ? "bad" : "");
}

// refresh() every PERIOD_MS, one at a time; a failure is shown, never stops the page
function every(refresh) {
  async function loop() {
    try { await refresh(); } catch (e) { noteError("page: " + e); showErrors(); }
    setTimeout(loop, PERIOD_MS);
  }
  loop();
}
