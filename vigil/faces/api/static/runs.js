// Runs page: list runs, fetch one tag of the chosen runs, draw them as SVG polylines with a legend.
"use strict";
(function () {
  const DASH = ["", "6 3", "2 3", "8 3 2 3", "1 2"];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"];
  const svgNS = "http://www.w3.org/2000/svg";
  let runs = [];
  const authHeaders = () => (vigilToken() ? { Authorization: "Bearer " + vigilToken() } : {});

  function el(name, attrs, parent) {
    const node = document.createElementNS(svgNS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    parent.appendChild(node);
    return node;
  }

  function chosen() {
    return Array.from(document.querySelectorAll("#run-list input:checked")).map((i) => i.value);
  }

  function refreshTags() {
    const names = new Set(chosen());
    const tags = new Set();
    runs.filter((r) => names.has(r.name)).forEach((r) => r.tags.forEach((t) => tags.add(t)));
    const select = document.getElementById("tag");
    const current = select.value;
    select.textContent = "";
    Array.from(tags).sort().forEach((t) => {
      const o = document.createElement("option");
      o.value = o.textContent = t;
      select.appendChild(o);
    });
    if (tags.has(current)) select.value = current;
  }

  function draw(data) {
    const svg = document.getElementById("runs-plot");
    svg.textContent = "";
    const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), L = 60, B = 30;
    const xs = data.series.flatMap((s) => s.x), ys = data.series.flatMap((s) => s.values.filter((v) => v !== null));
    if (!xs.length || !ys.length) return;
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = (x) => L + ((x - x0) / (x1 - x0 || 1)) * (W - L - 10);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0 || 1)) * (H - B - 10);
    el("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: "#555" }, svg);
    el("line", { x1: L, y1: 10, x2: L, y2: H - B, stroke: "#555" }, svg);
    [[x0, "start"], [x1, "end"]].forEach(([v, a]) => {
      el("text", { x: sx(v), y: H - 8, "text-anchor": a, "font-size": 12 }, svg).textContent = v.toPrecision(4);
    });
    [y0, y1].forEach((v) => {
      el("text", { x: L - 4, y: sy(v), "text-anchor": "end", "font-size": 12 }, svg).textContent = v.toPrecision(4);
    });
    const legend = document.getElementById("runs-legend");
    legend.textContent = "";
    data.series.forEach((s, i) => {
      const pts = s.x.map((x, j) => (s.values[j] === null ? null : `${sx(x).toFixed(1)},${sy(s.values[j]).toFixed(1)}`))
        .filter((p) => p !== null).join(" ");
      const color = COLORS[i % COLORS.length], dash = DASH[i % DASH.length];
      el("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": 1.5, "stroke-dasharray": dash,
        "data-run": s.run }, svg);
      const item = document.createElement("span");
      item.className = "legend-item";
      item.textContent = `${s.run} (${dash ? "dashed " + (i % DASH.length) : "solid"}, ${s.x.length} points) `;
      item.style.color = color;
      legend.appendChild(item);
    });
  }

  async function compare(event) {
    if (event) event.preventDefault();
    const status = document.getElementById("runs-status");
    const names = chosen(), tag = document.getElementById("tag").value;
    if (!names.length || !tag) { status.textContent = "Pick at least one run and a tag."; return; }
    const q = new URLSearchParams({ tag, align: document.getElementById("align").value, points: "1000" });
    names.forEach((n) => q.append("run", n));
    const started = performance.now();
    const response = await fetch(`/api/v1/runs/scalars?${q}`, { headers: authHeaders() });
    if (!response.ok) { status.textContent = `Error: ${(await response.json()).detail}`; return; }
    const data = await response.json();
    draw(data);
    status.textContent = `${data.series.length} runs of ${tag} in ${(performance.now() - started).toFixed(0)} ms`;
    document.body.dataset.plotted = "yes";
  }

  async function load() {
    const status = document.getElementById("runs-status");
    const response = await fetch("/api/v1/runs", { headers: authHeaders() });
    if (!response.ok) { status.textContent = (await response.json()).detail; return; }
    runs = await response.json();
    const list = document.getElementById("run-list");
    runs.forEach((r, i) => {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox"; box.value = r.name; box.checked = i < 2;
      box.addEventListener("change", refreshTags);
      label.append(box, ` ${r.name}${r.merged_from ? " (merged)" : ""} `);
      list.appendChild(label);
    });
    refreshTags();
    document.getElementById("runs-form").addEventListener("submit", compare);
    document.body.dataset.loaded = "yes";
  }
  document.addEventListener("DOMContentLoaded", load);
})();
