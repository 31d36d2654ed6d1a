"""dcgm-exporter scraping: names kept, entities mapped, bad pages counted and never fatal."""

from __future__ import annotations

import logging

from vigil.collect.dcgm import DcgmExporterScraper


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
