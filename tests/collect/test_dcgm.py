"""dcgm-exporter scraping: names kept, entities mapped, bad pages counted and never fatal."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.collect.conftest import FIXTURES
from vigil.sources.collect.dcgm import DcgmExporterScraper

FIXTURE = FIXTURES / "dcgm_exporter_page.txt"


def by_key(collection) -> dict[tuple[str, str], float]:
    return {(p.metric, p.entity): p.value for p in collection.points if not p.labels or p.metric != "x"}


def test_scrape_real_http_page_keeps_dcgm_names(page_server, dcgm_page) -> None:
    page_server.page = dcgm_page.encode()
    scraper = DcgmExporterScraper(f"{page_server.url}/metrics", node="n07")
    out = scraper.collect(0.0)
    values = by_key(out)
    assert values[("DCGM_FI_DEV_GPU_TEMP", "gpu/n07/1")] == 83
    assert values[("DCGM_FI_DEV_POWER_USAGE", "gpu/n07/0")] == 551.2
    assert values[("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "gpu/n07/1")] == 14
    xid_counts = {dict(p.labels)["xid"]: p.value for p in out.points if p.metric == "DCGM_EXP_XID_ERRORS_COUNT"}
    assert xid_counts == {"79": 1.0, "48": 2.0}
    # identity labels are dropped; bounded and unbounded extras are left for the agent's label guard
    temp = next(p for p in out.points if p.metric == "DCGM_FI_DEV_GPU_TEMP")
    assert dict(temp.labels).keys() == {"container", "namespace", "pod"}
    assert scraper.problems.total() == 0
    assert scraper.pci_to_index == {"0000:18:00": 0, "0000:2a:00": 1}  # for Xids when NVML cannot open
    scraper.close()


def test_corrupt_line_loses_only_that_line_and_is_logged_once(dcgm_page, caplog) -> None:
    lines = dcgm_page.splitlines(keepends=True)
    lines.insert(5, 'DCGM_FI_DEV_GPU_TEMP{gpu="9",UUID="GPU-x" 4x5\n')
    corrupt = "".join(lines)
    scraper = DcgmExporterScraper("http://unused", node="n07")
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        out = scraper.parse_page(corrupt)
    good = scraper.parse_page(dcgm_page)
    assert len(out.points) == len(good.points)
    assert scraper.problems.counts["corrupt page"] == 3
    assert scraper.problems.counts["malformed line"] == 3
    assert sum("malformed line" in r.message for r in caplog.records) == 1


def test_truncated_page_drops_the_partial_last_line(dcgm_page) -> None:
    scraper = DcgmExporterScraper("http://unused", node="n07")
    cut = dcgm_page.rindex(" 2\n") + 2  # ... xid="48"} 2 -> keep the value's first digit only
    truncated = dcgm_page[: cut - 1]
    out = scraper.parse_page(truncated)
    assert not any(dict(p.labels).get("xid") == "48" for p in out.points)
    assert scraper.problems.counts["truncated page"] == 1
    # mid-label truncation
    out = scraper.parse_page(dcgm_page[: dcgm_page.index('DCGM_FI_DEV_GPU_TEMP{gpu="1"') + 20])
    assert ("DCGM_FI_DEV_GPU_TEMP", "gpu/n07/0") in by_key(out)
    assert ("DCGM_FI_DEV_GPU_TEMP", "gpu/n07/1") not in by_key(out)


def test_empty_garbage_and_unreachable_pages_are_counted(page_server) -> None:
    scraper = DcgmExporterScraper("http://unused", node="n07")
    assert scraper.parse_page("").points == []
    assert scraper.parse_page("\x00\xff<html>502 Bad Gateway</html>\n").points == []
    assert scraper.problems.counts["empty page"] == 1
    assert scraper.problems.counts["malformed line"] == 1
    page_server.status = 503
    page_server.page = b"busy"
    down = DcgmExporterScraper(f"{page_server.url}/metrics", node="n07", timeout_s=2)
    out = down.collect(0.0)
    assert "unreachable" in out.status and down.problems.counts["unreachable"] == 1


def test_hostile_hostname_label_cannot_change_the_entity(dcgm_page) -> None:
    hostile = dcgm_page.replace('Hostname="dcgm-exporter-x7k2p"', 'Hostname="../../etc node/evil"')
    out = DcgmExporterScraper("http://unused", node="n07").parse_page(hostile)
    assert {p.entity for p in out.points} == {"gpu/n07/0", "gpu/n07/1"}


def test_simulated_exporter_page_round_trips_the_simulator_values() -> None:
    import numpy as np

    from vigil.faces.api.dcgm import render_dcgm
    from vigil.sources.sim import SimConfig, simulate

    run = simulate(SimConfig(nodes=1, gpus=8, minutes=1, seed=5))
    frame = next(f for f in next(iter(run.ticks())).frames if f.family == "gpu")
    node = frame.entities[0].split("/")[1]
    out = DcgmExporterScraper("http://unused", node=node).parse_page(render_dcgm(frame, run.topology))
    got = {(p.metric, p.entity): p.value for p in out.points}
    checked = 0
    for i, entity in enumerate(frame.entities):
        for j, metric in enumerate(frame.metrics):
            value = float(frame.values[i, j])
            if metric.startswith("DCGM_") and not np.isnan(value):
                assert got[(metric, entity)] == pytest.approx(value, rel=1e-6), metric
                checked += 1
    assert checked >= 8 * 25


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_mangling_of_a_page_never_raises(data: st.DataObject) -> None:
    page = (FIXTURE).read_text()
    cut = data.draw(st.integers(0, len(page)))
    junk = data.draw(st.text(max_size=40))
    where = data.draw(st.integers(0, cut))
    mangled = page[:where] + junk + page[where:cut]
    scraper = DcgmExporterScraper("http://unused", node="n07")
    out = scraper.parse_page(mangled)
    assert all(p.entity.startswith(("gpu/n07/", "node/n07")) for p in out.points)


def test_last_xid_gauge_changes_become_events_when_asked(dcgm_page) -> None:
    from vigil.model import FaultLevel

    scraper = DcgmExporterScraper("http://unused", node="n07", xid_events=True)
    assert scraper.parse_page(dcgm_page, 1.0).events == []  # first sight: history of unknown age
    assert scraper.parse_page(dcgm_page, 2.0).events == []  # the sticky gauge repeats: no news
    lines = [
        line[: line.rindex(" ")] + " 119" if line.startswith('DCGM_FI_DEV_XID_ERRORS{gpu="0"') else line
        for line in dcgm_page.splitlines()
    ]
    changed = "\n".join(lines) + "\n"
    [event] = scraper.parse_page(changed, 3.0).events
    assert (event.entity, event.kind, event.attrs["xid"], event.level) == (
        "gpu/n07/0",
        "xid",
        119,
        FaultLevel.DRAIN,
    )
    assert DcgmExporterScraper("http://unused", node="n07").parse_page(changed, 4.0).events == []
