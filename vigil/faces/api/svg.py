"""Server-side SVG for the dashboard: no JavaScript charting library, no CDN, identical in every browser."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from vigil.knowledge.metrics import metric_catalogue
from vigil.model import Evidence, FaultLevel

LEVEL_COLORS = {0: "#2e7d32", 1: "#9ccc65", 2: "#fbc02d", 3: "#ef6c00", 4: "#c62828"}
KIND_COLORS = {
    "metric": "#1565c0",
    "event": "#6a1b9a",
    "log": "#455a64",
    "detector": "#00838f",
    "hang": "#c62828",
    "topology": "#5d4037",
    "peer": "#ef6c00",
    "precheck": "#2e7d32",
}


def _level_name(level: int) -> str:
    return FaultLevel(level).label


def heat_map(grid: list[dict[str, Any]], cell: int = 18) -> str:
    """Nodes (rows) x GPUs (columns), each cell coloured by the GPU's fault level; the node's own level is
    the first column. Each cell links to its GPU's (or the node's) page."""
    if not grid:
        return '<p class="empty">No topology stored yet.</p>'
    columns = max(len(row["gpus"]) for row in grid)
    label_w = 9 * max(len(row["name"]) for row in grid) + 10
    width = label_w + (columns + 1) * (cell + 2) + 10
    height = 22 + len(grid) * (cell + 2)
    parts = [
        f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="cluster heat map">'
    ]
    parts.append(f'<text x="{label_w + cell / 2}" y="12" class="axis" text-anchor="middle">n</text>')
    for g in range(columns):
        parts.append(f'<text x="{label_w + (g + 1) * (cell + 2) + 4}" y="12" class="axis">{g}</text>')
    for r, row in enumerate(grid):
        y = 18 + r * (cell + 2)
        name = escape(row["name"])
        parts.append(f'<text x="0" y="{y + cell - 5}" class="label">{name}</text>')
        cells = [("node/" + row["name"], row["node_level"], "node", f"/nodes/{name}")] + [
            (g["id"], g["level"], f"gpu {g['index']}", f"/gpus/{name}/{g['index']}") for g in row["gpus"]
        ]
        for c, (entity, level, what, url) in enumerate(cells):
            x = label_w + c * (cell + 2)
            parts.append(
                f'<a href="{url}"><rect x="{x}" y="{y}" width="{cell}" height="{cell}" rx="3" '
                f'fill="{LEVEL_COLORS[level]}" class="cell level-{level}" data-entity="{escape(entity)}" '
                f'data-level="{level}"><title>{escape(entity)} ({what}): {_level_name(level)}</title>'
                "</rect></a>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _time_axis(t0: float, t1: float, x0: float, x1: float, y: float) -> list[str]:
    parts = [f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" class="axisline"/>']
    for k in range(5):
        t = t0 + (t1 - t0) * k / 4
        x = x0 + (x1 - x0) * k / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        parts.append(f'<text x="{x:.1f}" y="{y + 14}" class="axis" text-anchor="{anchor}">+{t - t0:.0f}s</text>')
    return parts


def evidence_timeline(evidence: Sequence[Evidence], start: float, end: float, width: int = 860) -> str:
    """One lane per entity, one marker per piece of evidence (coloured and shaped by kind, hover for the
    summary), the incident's span shaded; the plots of the metrics that moved sit under it on the page."""
    entities = sorted({e.entity for e in evidence})
    if not entities:
        return '<p class="empty">No evidence recorded.</p>'
    times = [e.ts for e in evidence] + [start, end]
    t0, t1 = min(times), max(times)
    pad = max((t1 - t0) * 0.05, 1.0)
    t0, t1 = t0 - pad, t1 + pad
    label_w, lane_h = 170, 24
    height = 30 + len(entities) * lane_h + 30

    def x_of(t: float) -> float:
        return label_w + (width - label_w - 10) * (t - t0) / (t1 - t0)

    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="evidence timeline: {len(evidence)} pieces of evidence on {len(entities)} entities">'
    ]
    parts.append(
        f'<rect x="{x_of(start):.1f}" y="10" width="{max(x_of(end) - x_of(start), 2):.1f}" '
        f'height="{len(entities) * lane_h}" class="span"/>'
    )
    for i, entity in enumerate(entities):
        y = 10 + i * lane_h + lane_h / 2
        parts.append(f'<text x="0" y="{y + 4}" class="label">{escape(entity)}</text>')
        parts.append(f'<line x1="{label_w}" y1="{y}" x2="{width - 10}" y2="{y}" class="lane"/>')
    for ev in evidence:
        y = 10 + entities.index(ev.entity) * lane_h + lane_h / 2
        parts.append(
            f'<circle cx="{x_of(ev.ts):.1f}" cy="{y}" r="6" fill="{KIND_COLORS.get(ev.kind, "#000")}" '
            f'class="evidence" data-ref="{escape(ev.ref)}"><title>[{escape(ev.ref)}] {escape(ev.kind)}: '
            f"{escape(ev.summary)}</title></circle>"
            f'<text x="{x_of(ev.ts):.1f}" y="{y + 3.5:.1f}" class="kind-letter" text-anchor="middle">'
            f"{escape(ev.kind[0].upper())}</text>"
        )
    parts.extend(_time_axis(t0, t1, label_w, width - 10, 10 + len(entities) * lane_h + 8))
    parts.append("</svg>")
    return "".join(parts)


def spark(
    ts: Sequence[float],
    values: Sequence[float],
    metric: str,
    entity: str,
    start: float,
    end: float,
    width: int = 300,
    height: int = 124,
) -> str:
    """One metric of one entity as a small line plot, the span [start, end] shaded, titled from the metric
    catalogue, with its range written out (the plot says what moved; the numbers say by how much)."""
    spec = metric_catalogue().get(metric)
    title, unit = (spec.help, f" {spec.unit}") if spec else (metric, "")
    points = [(t, v) for t, v in zip(ts, values, strict=True) if v == v]
    if not points:
        return f'<p class="empty">{escape(metric)} on {escape(entity)}: no samples.</p>'
    t0, t1 = points[0][0], points[-1][0]
    t0, t1 = min(t0, start), max(t1, end, t0 + 1.0)
    lo = min(v for _, v in points)
    hi = max(v for _, v in points)
    span = (hi - lo) or 1.0
    left, top, bottom = 4, 44, height - 18

    def x_of(t: float) -> float:
        return left + (width - left - 4) * (t - t0) / (t1 - t0)

    def y_of(v: float) -> float:
        return bottom - (v - lo) / span * (bottom - top)

    path = " ".join(f"{'M' if k == 0 else 'L'}{x_of(t):.1f},{y_of(v):.1f}" for k, (t, v) in enumerate(points))
    return "".join(
        [
            f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'data-metric="{escape(metric)}" data-entity="{escape(entity)}" role="img" '
            f'aria-label="{escape(metric)} on {escape(entity)}, {lo:.4g} to {hi:.4g}">',
            f'<rect x="{x_of(start):.1f}" y="{top}" width="{max(x_of(end) - x_of(start), 2):.1f}" '
            f'height="{bottom - top}" class="moved"/>',
            f'<text x="{left}" y="12" class="title">{escape(title)}</text>',
            f'<text x="{left}" y="25" class="axis">{escape(metric)}</text>',
            f'<text x="{left}" y="38" class="axis">{escape(entity)}: {lo:.4g} .. {hi:.4g}{escape(unit)}</text>',
            f'<path d="{path}" class="series"/>',
            f'<text x="{left}" y="{height - 4}" class="axis">{t0 - start:+.0f} s</text>',
            f'<text x="{width - 4}" y="{height - 4}" class="axis" text-anchor="end">'
            f"{t1 - start:+.0f} s from start</text>",
            "</svg>",
        ]
    )


def step_time_chart(ranks: dict[int, dict[str, list[Any]]], width: int = 860, height: int = 260) -> str:
    """Per-rank step-time lines; the rank with the highest median (the straggler) drawn in red."""
    series = {r: [(t, v) for t, v in zip(d["ts"], d["values"], strict=True) if v is not None] for r, d in ranks.items()}
    series = {r: pts for r, pts in series.items() if pts}
    if not series:
        return '<p class="empty">No per-rank step times stored for this job.</p>'
    all_t = [t for pts in series.values() for t, _ in pts]
    all_v = [v for pts in series.values() for _, v in pts]
    t0, t1 = min(all_t), max(all_t) or 1.0
    lo, hi = 0.0, max(all_v) * 1.1 or 1.0
    left, bottom = 50, height - 30

    def median(pts: list[tuple[float, float]]) -> float:
        values = sorted(v for _, v in pts)
        return values[len(values) // 2]

    # A straggler needs peers: with one line there is nothing to single out.
    slowest = max(series, key=lambda r: median(series[r])) if len(series) > 1 else None
    parts = [f'<svg class="steptimes" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        y = bottom - (bottom - 10) * k / 4
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" class="axis" text-anchor="end">{v:.2f}s</text>')
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" class="grid"/>')
    for rank in sorted(series, key=lambda r: r == slowest):
        pts = series[rank]
        path = " ".join(
            f"{'M' if k == 0 else 'L'}{left + (width - left - 10) * (t - t0) / ((t1 - t0) or 1):.1f},"
            f"{bottom - (bottom - 10) * (v - lo) / (hi - lo):.1f}"
            for k, (t, v) in enumerate(pts)
        )
        cls = "rank slowest" if rank == slowest else "rank"
        parts.append(
            f'<path d="{path}" class="{cls}" data-rank="{rank}"><title>rank {rank}: median '
            f"{median(pts):.3f}s</title></path>"
        )
    parts.extend(_time_axis(t0, t1, left, width - 10, bottom))
    parts.append("</svg>")
    return "".join(parts)


def ring(
    world_size: int, culprit_links: Sequence[tuple[int, int]], culprit_ranks: Sequence[int], size: int = 360
) -> str:
    """The ranks on a ring (r -> r+1, as NCCL's ring all-reduce passes data); culprit links and ranks red."""
    if world_size <= 0:
        return '<p class="empty">No ranks in this report.</p>'
    cx = cy = size / 2
    radius = size / 2 - 40
    pos = {
        r: (
            cx + radius * math.sin(2 * math.pi * r / world_size),
            cy - radius * math.cos(2 * math.pi * r / world_size),
        )
        for r in range(world_size)
    }
    bad_links = {(int(a), int(b)) for a, b in culprit_links}
    links: set[tuple[int, int]] = set()
    if world_size > 1:
        links = {(r, (r + 1) % world_size) for r in range(world_size)}
    links |= bad_links
    parts = [
        f'<svg class="ring" xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="18" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/></marker>'
        '<marker id="arrow-bad" viewBox="0 0 10 10" refX="18" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#c62828"/></marker></defs>',
    ]
    for src, dst in sorted(links):
        if src not in pos or dst not in pos:
            continue
        (x1, y1), (x2, y2) = pos[src], pos[dst]
        bad = (src, dst) in bad_links
        parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'class="{"link culprit" if bad else "link"}" data-link="{src}-{dst}" '
            f'marker-end="url(#{"arrow-bad" if bad else "arrow"})"><title>rank {src} -> rank {dst}'
            f"{' (stalled here)' if bad else ''}</title></line>"
        )
    for r, (x, y) in pos.items():
        cls = "rank culprit" if r in culprit_ranks else "rank"
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="13" class="{cls}" data-rank="{r}"/>'
            f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" class="ranklabel">{r}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
