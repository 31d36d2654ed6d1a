"""The runs page in headless Chromium: pick runs, compare one tag, see both lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.tensorboard import SummaryWriter

from tests.serve.conftest import ARTIFACTS, serve_in_thread
from vigil.config import Settings
from vigil.faces.api.app import create_app
from vigil.sources.tensorboard import RunIndex
from vigil.store.sql import Store

pytestmark = pytest.mark.slow


def test_runs_page_plots_the_chosen_runs(browser: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name, scale in (("baseline", 1.0), ("bigger-lr", 3.0)):
        writer = SummaryWriter(log_dir=str(tmp_path / "logs" / name))
        for step in range(300):
            writer.add_scalar("loss", scale / (1 + step), global_step=step)
        writer.close()
    index = RunIndex(home / "runs.sqlite")
    index.update(tmp_path / "logs")
    index.close()
    settings = Settings(home=home, db_url=f"sqlite:///{home / 'vigil.db'}")
    app = create_app(Store(settings.database_url()), settings=settings)
    with serve_in_thread(app) as site:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        foreign: list[str] = []
        page.on("request", lambda request: None if request.url.startswith(site) else foreign.append(request.url))
        page.goto(site + "/runs")
        page.wait_for_selector("body[data-loaded='yes']")
        assert page.locator("#run-list input").count() == 2
        page.click("#runs-form button")
        page.wait_for_selector("body[data-plotted='yes']")
        lines = page.locator("#runs-plot polyline")
        assert lines.count() == 2
        assert {lines.nth(i).get_attribute("data-run") for i in range(2)} == {"baseline", "bigger-lr"}
        assert "2 runs of loss" in page.locator("#runs-status").inner_text()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "serve-runs.png"), full_page=True)
        context.close()
        assert not foreign
