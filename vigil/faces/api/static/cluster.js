// The cluster page: every GPU on one canvas, grouped by leaf switch or rack, a row per node, a cell per GPU.
// Unhealthy GPUs get a shape per level on top of their colour, so colour is never the only signal.
"use strict";

const LEVEL_COLORS = ["#2e7d32", "#9ccc65", "#fbc02d", "#ef6c00", "#c62828"];
const FADED = "#e4e7ea";
const MAP_URL = "/api/v1/cluster/map";

const state = {
  map: null,            // the ClusterMap JSON
  at: null,             // null: live (now); else a unix time
  levelFilter: new Set(),
  job: "", switchName: "", fault: "", group: "switch", worstFirst: false,
  focus: -1,            // flat GPU position under the keyboard / click focus
  layout: null,
  nodeOf: null,         // Int32Array: flat GPU position -> node
  jobsOf: null,         // per GPU position: list of job indices (built lazily)
  match: null,          // Uint8Array per GPU: passes the filters
  firstRenderMs: null,
};

function level(pos) { return state.map.gpu_levels.charCodeAt(pos) - 48; }
function nodeLevel(node) { return state.map.node_levels.charCodeAt(node) - 48; }
function levelName(lv) { return state.map.level_names[lv]; }
// Records carry the level's label ("drain"); the packed gpu_levels / node_levels columns index level_names.
function levelOf(label) { return state.map.level_names.indexOf(label); }

function gpuIndex(node, k) {
  const odd = state.map.gpu_index[node];
  return odd ? odd[k] : k;
}

function gpuId(pos) {
  const node = state.nodeOf[pos];
  return "gpu/" + state.map.nodes[node] + "/" + gpuIndex(node, pos - state.map.gpu_start[node]);
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) { node.setAttribute(k, v); }
  if (text !== undefined) { node.textContent = text; }
  return node;
}

function glyph(lv) { return el("span", {"class": "glyph level-" + lv, "aria-hidden": "true"}); }

// ------------------------------------------------------------------ data

async function loadMap() {
  const url = state.at === null ? MAP_URL : MAP_URL + "?at=" + encodeURIComponent(state.at);
  const response = await fetch(url);
  if (!response.ok) { throw new Error("map: HTTP " + response.status); }
  const first = state.map === null;
  state.map = await response.json();
  const m = state.map;
  state.nodeOf = new Int32Array(m.gpu_start[m.gpu_start.length - 1]);
  for (let n = 0; n < m.nodes.length; n++) {
    state.nodeOf.fill(n, m.gpu_start[n], m.gpu_start[n + 1]);
  }
  state.jobsOf = null;
  refresh();
  if (first) {
    fillControls();  // after the first draw: the map is what the page is for
    document.body.dataset.mapReady = "1";
  }
}

function jobsOf(pos) {
  if (state.jobsOf === null) {
    state.jobsOf = new Map();
    state.map.jobs.forEach((job, j) => {
      for (const [first, count] of job.gpu_runs) {
        for (let p = first; p < first + count; p++) {
          if (!state.jobsOf.has(p)) { state.jobsOf.set(p, []); }
          state.jobsOf.get(p).push(j);
        }
      }
    });
  }
  return state.jobsOf.get(pos) || [];
}

function incidentsOf(pos) {
  const node = state.nodeOf[pos];
  return state.map.incidents.filter((inc) => inc.gpus.includes(pos) || inc.nodes.includes(node));
}

// ------------------------------------------------------------------ controls

function fillControls() {
  const m = state.map;
  const jobs = document.getElementById("f-job");
  for (const job of m.jobs) { jobs.append(el("option", {value: job.id}, job.id + (job.name ? " " + job.name : ""))); }
  const switches = document.getElementById("f-switch");
  for (const name of m.switches) { switches.append(el("option", {value: name}, name)); }
  for (const id of ["f-job", "f-switch", "f-fault", "f-group", "f-worst"]) {
    document.getElementById(id).addEventListener("change", readFilters);
  }
  const search = document.getElementById("f-search");
  search.addEventListener("focus", fillEntityList, {once: true});
  search.addEventListener("change", () => find(search.value));
  search.addEventListener("keydown", (event) => { if (event.key === "Enter") { find(search.value); } });
  setupTime();
}

function fillFaultTypes() {
  const select = document.getElementById("f-fault");
  const types = new Set();
  for (const inc of state.map.incidents) { inc.fault_types.forEach((t) => types.add(t)); }
  const keep = select.value;
  select.replaceChildren(el("option", {value: ""}, "all"));
  for (const t of [...types].sort()) { select.append(el("option", {value: t}, t)); }
  select.value = types.has(keep) ? keep : "";
  state.fault = select.value;
}

function fillEntityList() {
  const list = document.getElementById("entity-list");
  const m = state.map;
  const names = [...m.nodes, ...m.jobs.map((j) => j.id), ...m.switches, ...m.incidents.map((i) => i.id)];
  list.replaceChildren(...names.map((name) => el("option", {value: name})));
}

function readFilters() {
  state.job = document.getElementById("f-job").value;
  state.switchName = document.getElementById("f-switch").value;
  state.fault = document.getElementById("f-fault").value;
  state.group = document.getElementById("f-group").value;
  state.worstFirst = document.getElementById("f-worst").checked;
  refresh();
}

function renderCounts() {
  const box = document.getElementById("counts");
  box.replaceChildren();
  state.map.level_names.forEach((name, lv) => {
    const button = el("button", {type: "button", "class": "count level-" + lv, "data-level": lv,
      "aria-pressed": String(state.levelFilter.has(lv))});
    button.append(glyph(lv), document.createTextNode(" " + name + " "), el("b", {}, String(state.map.counts[name])));
    button.addEventListener("click", () => {
      if (state.levelFilter.has(lv)) { state.levelFilter.delete(lv); } else { state.levelFilter.add(lv); }
      refresh();
    });
    box.append(button);
  });
}

function computeMatch() {
  const m = state.map;
  const total = m.gpu_levels.length;
  const match = new Uint8Array(total).fill(1);
  if (state.levelFilter.size) {
    for (let p = 0; p < total; p++) { if (!state.levelFilter.has(level(p))) { match[p] = 0; } }
  }
  if (state.switchName) {
    const s = m.switches.indexOf(state.switchName);
    for (let p = 0; p < total; p++) { if (m.node_switch[state.nodeOf[p]] !== s) { match[p] = 0; } }
  }
  if (state.job) {
    const keep = new Uint8Array(total);
    const job = m.jobs.find((j) => j.id === state.job);
    for (const [first, count] of (job ? job.gpu_runs : [])) { keep.fill(1, first, first + count); }
    for (let p = 0; p < total; p++) { match[p] &= keep[p]; }
  }
  if (state.fault) {
    const keep = new Uint8Array(total);
    for (const inc of m.incidents) {
      if (!inc.fault_types.includes(state.fault)) { continue; }
      inc.gpus.forEach((p) => { keep[p] = 1; });
      inc.nodes.forEach((n) => keep.fill(1, m.gpu_start[n], m.gpu_start[n + 1]));
    }
    for (let p = 0; p < total; p++) { match[p] &= keep[p]; }
  }
  state.match = match;
}

// ------------------------------------------------------------------ layout and drawing

function groups() {
  const m = state.map;
  const key = state.group === "rack" ? m.node_rack : m.node_switch;
  const names = state.group === "rack" ? m.racks : m.switches;
  const byKey = new Map();
  for (let n = 0; n < m.nodes.length; n++) {
    if (!byKey.has(key[n])) { byKey.set(key[n], {name: names[key[n]] || "(none)", nodes: [], worst: 0, bad: 0}); }
    const g = byKey.get(key[n]);
    g.nodes.push(n);
    g.worst = Math.max(g.worst, nodeLevel(n));
    for (let p = m.gpu_start[n]; p < m.gpu_start[n + 1]; p++) {
      const lv = level(p);
      g.worst = Math.max(g.worst, lv);
      if (lv > 0) { g.bad++; }
    }
  }
  const list = [...byKey.values()];
  if (state.worstFirst) { list.sort((a, b) => b.worst - a.worst || b.bad - a.bad); }
  return list;
}

function placeBlocks(list, pitch, gap, width) {
  const m = state.map;
  let widest = 1;
  for (let n = 0; n < m.nodes.length; n++) { widest = Math.max(widest, m.gpu_start[n + 1] - m.gpu_start[n] + 1); }
  const blocks = [];
  let x = 0, y = 0, rowHeight = 0;
  for (const g of list) {
    const w = widest * pitch, h = g.nodes.length * pitch;
    if (x > 0 && x + w > width) { x = 0; y += rowHeight + gap; rowHeight = 0; }
    blocks.push({group: g, x: x, y: y, w: w, h: h});
    x += w + gap;
    rowHeight = Math.max(rowHeight, h);
  }
  return {blocks: blocks, height: y + rowHeight, pitch: pitch, gap: gap};
}

function layout() {
  const canvas = document.getElementById("map");
  const width = Math.max(320, canvas.parentElement.clientWidth - 4);
  const top = canvas.getBoundingClientRect().top + window.scrollY;
  const room = Math.max(260, window.innerHeight - top - 60);
  const list = groups();
  let best = null;
  for (let pitch = 14; pitch >= 3; pitch--) {
    best = placeBlocks(list, pitch, Math.max(3, Math.round(pitch * 0.7)), width);
    if (best.height <= room) { break; }
  }
  best.width = width;
  best.cellOf = new Map();  // flat GPU position -> [x, y] of its cell (the node's own cell sits left of its GPUs)
  for (const b of best.blocks) {
    b.group.nodes.forEach((n, row) => {
      for (let p = state.map.gpu_start[n]; p < state.map.gpu_start[n + 1]; p++) {
        best.cellOf.set(p, [b.x + (p - state.map.gpu_start[n] + 1) * best.pitch, b.y + row * best.pitch]);
      }
    });
  }
  state.layout = best;
}

function shape(ctx, lv, cx, cy, r) {
  ctx.beginPath();
  if (lv === 1) {
    ctx.arc(cx, cy, r, 0, 2 * Math.PI);
  } else if (lv === 2) {
    ctx.moveTo(cx, cy - r); ctx.lineTo(cx + r, cy + r); ctx.lineTo(cx - r, cy + r); ctx.closePath();
  } else if (lv === 3) {
    ctx.moveTo(cx, cy - r); ctx.lineTo(cx + r, cy); ctx.lineTo(cx, cy + r); ctx.lineTo(cx - r, cy); ctx.closePath();
  } else {
    ctx.rect(cx - r, cy - r, 2 * r, 2 * r);
    ctx.moveTo(cx - r, cy - r); ctx.lineTo(cx + r, cy + r); ctx.moveTo(cx + r, cy - r); ctx.lineTo(cx - r, cy + r);
  }
  ctx.stroke();
}

function draw() {
  const m = state.map, L = state.layout;
  const canvas = document.getElementById("map");
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(L.width * ratio);
  canvas.height = Math.round((L.height + 8) * ratio);
  canvas.style.width = L.width + "px";
  canvas.style.height = (L.height + 8) + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, L.width, L.height + 8);
  const inner = Math.max(1, L.pitch - 1);
  const marks = [];
  for (const b of L.blocks) {
    ctx.fillStyle = "#cfd8dc";
    ctx.fillRect(b.x - 1, b.y - 1, b.w + 1, b.h + 1);
    b.group.nodes.forEach((n, row) => {
      const y = b.y + row * L.pitch;
      const own = nodeLevel(n);
      ctx.fillStyle = own > 0 ? LEVEL_COLORS[own] : "#90a4ae";  // the node's own cell, left of its GPUs
      ctx.fillRect(b.x, y, inner, inner);
      if (own > 0) { marks.push([own, b.x, y]); }
      for (let p = m.gpu_start[n]; p < m.gpu_start[n + 1]; p++) {
        const x = b.x + (p - m.gpu_start[n] + 1) * L.pitch;
        const lv = level(p);
        ctx.fillStyle = state.match[p] ? LEVEL_COLORS[lv] : FADED;
        ctx.fillRect(x, y, inner, inner);
        if (lv > 0 && state.match[p]) { marks.push([lv, x, y]); }
      }
    });
  }
  // Shapes on top, worst last so they stay visible where markers overlap.
  marks.sort((a, b) => a[0] - b[0]);
  const r = Math.max(3.5, L.pitch * 0.75);
  ctx.lineWidth = 1.3;
  ctx.strokeStyle = "#111";
  for (const [lv, x, y] of marks) { shape(ctx, lv, x + inner / 2, y + inner / 2, r); }
  if (state.focus >= 0 && L.cellOf.has(state.focus)) {
    const [x, y] = L.cellOf.get(state.focus);
    ctx.lineWidth = 2.5;
    ctx.strokeStyle = "#1565c0";
    ctx.strokeRect(x - 3, y - 3, inner + 6, inner + 6);
  }
}

function refresh() {
  fillFaultTypes();
  computeMatch();
  renderCounts();
  layout();
  draw();
  if (state.firstRenderMs === null) {  // the page's own number for the benchmark: when the map first showed
    state.firstRenderMs = performance.now();
    performance.mark("vigil-map-drawn");
  }
  renderUnhealthy();
  renderSwitches();
  document.getElementById("group-name").textContent = state.group === "rack" ? "racks" : "leaf switches";
  if (state.focus >= 0) { showDetail(state.focus); }
}

// ------------------------------------------------------------------ lists

function renderUnhealthy() {
  const m = state.map;
  const bad = [];
  for (let p = 0; p < m.gpu_levels.length; p++) {
    if (level(p) > 0 && state.match[p]) { bad.push(p); }
  }
  bad.sort((a, b) => level(b) - level(a) || a - b);
  document.getElementById("unhealthy-count").textContent = "(" + bad.length + " GPUs)";
  const list = document.getElementById("unhealthy-list");
  list.replaceChildren(...bad.map((p) => {
    const item = el("li", {"class": "level-" + level(p)});
    const node = state.nodeOf[p];
    const link = el("a", {href: "/gpus/" + m.nodes[node] + "/" + gpuIndex(node, p - m.gpu_start[node]), "data-pos": p},
      gpuId(p));
    link.addEventListener("focus", () => select(p, false));
    item.append(glyph(level(p)), document.createTextNode(" " + levelName(level(p)) + " "), link);
    return item;
  }));
  state.unhealthy = bad;
}

function renderSwitches() {
  const m = state.map;
  const rows = new Map();
  for (let p = 0; p < m.gpu_levels.length; p++) {
    const lv = level(p);
    if (lv === 0) { continue; }
    const s = m.node_switch[state.nodeOf[p]];
    if (!rows.has(s)) { rows.set(s, [0, 0, 0, 0, 0]); }
    rows.get(s)[lv]++;
  }
  const sorted = [...rows.entries()].sort((a, b) => b[1][4] - a[1][4] || b[1][3] - a[1][3] || b[1][2] - a[1][2]);
  const body = document.querySelector("table.switch-counts tbody");
  body.replaceChildren(...sorted.slice(0, 40).map(([s, c]) => {
    const row = el("tr", {"data-switch": m.switches[s] || ""});
    const name = el("td");
    const button = el("button", {type: "button", "class": "linkish"}, m.switches[s] || "(none)");
    button.addEventListener("click", () => {
      document.getElementById("f-switch").value = m.switches[s] || "";
      readFilters();
    });
    name.append(button);
    row.append(name, el("td", {}, String(c[4])), el("td", {}, String(c[3])), el("td", {}, String(c[2])),
      el("td", {}, String(c[1])), el("td", {}, String(c[1] + c[2] + c[3] + c[4])));
    return row;
  }));
}

// ------------------------------------------------------------------ hover, click, keys, search

function cellAt(x, y) {
  const L = state.layout, m = state.map;
  for (const b of L.blocks) {
    if (x < b.x || x >= b.x + b.w || y < b.y || y >= b.y + b.h) { continue; }
    const node = b.group.nodes[Math.floor((y - b.y) / L.pitch)];
    const col = Math.floor((x - b.x) / L.pitch) - 1;
    if (node === undefined) { return null; }
    if (col < 0) { return {node: node, pos: -1}; }
    const pos = m.gpu_start[node] + col;
    return pos < m.gpu_start[node + 1] ? {node: node, pos: pos} : null;
  }
  return null;
}

function describe(pos) {
  const m = state.map, node = state.nodeOf[pos];
  const parts = [gpuId(pos), levelName(level(pos)), "node " + m.nodes[node]];
  if (m.node_switch[node] >= 0) { parts.push("switch " + m.switches[m.node_switch[node]]); }
  if (m.node_rack[node] >= 0) { parts.push("rack " + m.racks[m.node_rack[node]]); }
  const jobs = jobsOf(pos).map((j) => m.jobs[j].id);
  if (jobs.length) { parts.push("job " + jobs.join(", ")); }
  return parts.join(" · ");
}

function showDetail(pos) {
  const m = state.map, node = state.nodeOf[pos];
  const box = document.getElementById("detail");
  const lv = level(pos);
  const head = el("h2");
  head.append(glyph(lv), document.createTextNode(" " + gpuId(pos) + " "), el("span", {"class": "pill level-" + lv}, levelName(lv)));
  const facts = el("p", {"class": "muted"}, describe(pos));
  const links = el("p");
  const gpuUrl = "/gpus/" + m.nodes[node] + "/" + gpuIndex(node, pos - m.gpu_start[node]);
  links.append(el("a", {href: gpuUrl, id: "detail-gpu"}, "GPU metrics"), document.createTextNode(" · "),
    el("a", {href: "/nodes/" + m.nodes[node], id: "detail-node"}, "node " + m.nodes[node] + " (" + levelName(nodeLevel(node)) + ")"));
  for (const j of jobsOf(pos)) {
    links.append(document.createTextNode(" · "), el("a", {href: "/jobs/" + m.jobs[j].id}, "job " + m.jobs[j].id));
  }
  const incidents = el("ul", {"class": "detail-incidents"});
  for (const inc of incidentsOf(pos)) {
    const item = el("li");
    item.append(glyph(levelOf(inc.level)), document.createTextNode(" "), el("a", {href: "/incidents/" + inc.id}, inc.title));
    incidents.append(item);
  }
  box.replaceChildren(head, facts, links, incidents.children.length ? incidents : el("p", {"class": "muted"}, "No incident on this GPU at this time."));
}

function select(pos, scroll) {
  state.focus = pos;
  draw();
  showDetail(pos);
  if (scroll) { document.getElementById("map").focus(); }
}

function step(delta) {
  // Arrow keys walk the cells in drawing order: left / right within a node, up / down to the next node.
  const L = state.layout, m = state.map;
  const order = [];
  for (const b of L.blocks) { for (const n of b.group.nodes) { order.push(n); } }
  let pos = state.focus < 0 ? m.gpu_start[order[0]] : state.focus;
  const node = state.nodeOf[pos], k = pos - m.gpu_start[node];
  const at = order.indexOf(node);
  if (delta === "left" || delta === "right") {
    pos += delta === "right" ? 1 : -1;
    if (pos < m.gpu_start[node] || pos >= m.gpu_start[node + 1]) {
      const next = order[(at + (delta === "right" ? 1 : order.length - 1)) % order.length];
      pos = delta === "right" ? m.gpu_start[next] : m.gpu_start[next + 1] - 1;
    }
  } else {
    const next = order[(at + (delta === "down" ? 1 : order.length - 1)) % order.length];
    pos = Math.min(m.gpu_start[next] + k, m.gpu_start[next + 1] - 1);
  }
  select(pos, false);
}

function jump(forward) {
  const bad = state.unhealthy || [];
  if (!bad.length) { return; }
  const at = bad.indexOf(state.focus);
  const next = at < 0 ? 0 : (at + (forward ? 1 : bad.length - 1)) % bad.length;
  select(bad[next], false);
}

function find(text) {
  const m = state.map, status = document.getElementById("search-status");
  const query = text.trim();
  if (!query) { status.textContent = ""; return; }
  const name = query.replace(/^(node|switch|job|rack)\//, "");
  const gpu = /^gpu\/([^/]+)\/(\d+)$/.exec(query);
  let pos = -1;
  if (gpu) {
    const node = m.nodes.indexOf(gpu[1]);
    for (let p = node >= 0 ? m.gpu_start[node] : 0; node >= 0 && p < m.gpu_start[node + 1]; p++) {
      if (gpuId(p) === query) { pos = p; }
    }
  } else if (m.nodes.includes(name)) {
    const node = m.nodes.indexOf(name);
    pos = m.gpu_start[node];
    for (let p = m.gpu_start[node]; p < m.gpu_start[node + 1]; p++) { if (level(p) > level(pos)) { pos = p; } }
  } else if (m.jobs.some((j) => j.id === name)) {
    document.getElementById("f-job").value = name;
    readFilters();
    status.textContent = "showing job " + name;
    return;
  } else if (m.switches.includes(name)) {
    document.getElementById("f-switch").value = name;
    readFilters();
    status.textContent = "showing switch " + name;
    return;
  } else {
    const inc = m.incidents.find((i) => i.id === query);
    if (inc) { pos = inc.gpus.length ? inc.gpus[0] : (inc.nodes.length ? m.gpu_start[inc.nodes[0]] : -1); }
  }
  if (pos < 0) {
    status.textContent = "nothing on the map is called " + query;
    return;
  }
  status.textContent = "found " + gpuId(pos);
  select(pos, false);
}

function setupPointer() {
  const canvas = document.getElementById("map");
  const tip = document.getElementById("tip");
  canvas.addEventListener("mousemove", (event) => {
    const rect = canvas.getBoundingClientRect();
    const hit = cellAt(event.clientX - rect.left, event.clientY - rect.top);
    if (!hit) { tip.hidden = true; return; }
    tip.textContent = hit.pos < 0
      ? "node/" + state.map.nodes[hit.node] + " · " + levelName(nodeLevel(hit.node)) + " (the node itself)"
      : describe(hit.pos);
    tip.style.left = (event.clientX - rect.left + 14) + "px";
    tip.style.top = (event.clientY - rect.top + 14) + "px";
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (event) => {
    const rect = canvas.getBoundingClientRect();
    const hit = cellAt(event.clientX - rect.left, event.clientY - rect.top);
    if (!hit) { return; }
    if (hit.pos < 0) { window.location.href = "/nodes/" + state.map.nodes[hit.node]; return; }
    select(hit.pos, false);
  });
  canvas.addEventListener("dblclick", () => { if (state.focus >= 0) { document.getElementById("detail-gpu").click(); } });
  canvas.addEventListener("keydown", (event) => {
    const moves = {ArrowLeft: "left", ArrowRight: "right", ArrowUp: "up", ArrowDown: "down"};
    if (moves[event.key]) { step(moves[event.key]); event.preventDefault(); }
    else if (event.key === "]") { jump(true); event.preventDefault(); }
    else if (event.key === "[") { jump(false); event.preventDefault(); }
    else if (event.key === "Enter" && state.focus >= 0) { document.getElementById("detail-gpu").click(); }
    else if ((event.key === "n" || event.key === "N") && state.focus >= 0) { document.getElementById("detail-node").click(); }
  });
  canvas.addEventListener("focus", () => { if (state.focus < 0) { jump(true); } });
  let pending = null;
  window.addEventListener("resize", () => {
    window.clearTimeout(pending);
    pending = window.setTimeout(() => { layout(); draw(); }, 150);
  });
}

// ------------------------------------------------------------------ time and live updates

function utc(ts) { return new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC"; }

function setupTime() {
  const slider = document.getElementById("t-slider");
  const live = document.getElementById("live");
  const label = document.getElementById("t-label");
  const span = state.map.span;
  if (span) {
    slider.min = String(Math.floor(span[0]) - 60);
    slider.max = String(Math.ceil(span[1]) + 60);
    slider.value = slider.max;
  } else {
    slider.disabled = true;
  }
  slider.addEventListener("input", () => { label.textContent = utc(Number(slider.value)); });
  slider.addEventListener("change", () => showAt(Number(slider.value)));
  live.addEventListener("click", () => showAt(null));
  connect();
}

async function showAt(at) {
  state.at = at;
  const live = document.getElementById("live");
  live.setAttribute("aria-pressed", String(at === null));
  const text = at === null ? "now" : "at " + utc(at);
  document.getElementById("t-label").textContent = text;
  document.getElementById("map-time").textContent = text;
  if (at === null) { document.getElementById("t-slider").value = document.getElementById("t-slider").max; }
  await loadMap();
}

function connect() {
  if (!window.EventSource) { return; }
  const status = document.getElementById("stream-status");
  const source = new EventSource("/api/v1/cluster/stream");
  source.addEventListener("open", () => { status.textContent = "live updates on"; });
  source.addEventListener("error", () => { status.textContent = "live updates reconnecting"; });
  source.addEventListener("levels", (event) => {
    const change = JSON.parse(event.data);
    status.textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
    if (state.at === null && change.cursor !== state.map.cursor) { loadMap(); }
  });
  source.addEventListener("incident", (event) => {
    const inc = JSON.parse(event.data);
    const item = el("li", {"class": "level-" + levelOf(inc.level)});
    item.append(glyph(levelOf(inc.level)), document.createTextNode(" " + inc.level + " "),
      el("a", {href: "/incidents/" + inc.id}, inc.title));
    document.getElementById("feed").prepend(item);
  });
}

// The page's own hooks for tests and the benchmark: where a GPU is drawn, and when the map first showed.
window.vigilMap = {
  state: state,
  cell: (pos) => state.layout.cellOf.get(pos),
  gpuId: gpuId,
  position: (entity) => { for (let p = 0; p < state.map.gpu_levels.length; p++) { if (gpuId(p) === entity) { return p; } } return -1; },
};

document.addEventListener("DOMContentLoaded", () => {
  setupPointer();
  loadMap().catch((err) => {
    document.getElementById("detail").textContent = "could not load the map: " + err.message;
  });
});
