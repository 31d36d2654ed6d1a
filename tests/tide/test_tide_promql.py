"""The tidal planner's load from a real Prometheus: the Azure conversation trace's requests, written as a request
counter in OpenMetrics and loaded into a TSDB with promtool (backfill), served by Debian's prometheus; the
per-interval peak rates read back through PromQL match those binned from the trace file itself."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, require_binary
from tests.serve.conftest import free_port
from vigil.model import VigilInputError
from vigil.remedy.tide.load import peak_rates, peak_rates_from_prometheus, read_request_times
from vigil.sources.promql import PromQLSource

pytestmark = pytest.mark.slow
INTERVAL_S = 300.0
RATE = "sum(rate(vllm:request_success_total[10s]))"


@pytest.fixture(scope="module")
def trace(shared_data: Path) -> Path:
    path = shared_data / "azure_llm_inference_2023" / "AzureLLMInferenceTrace_conv.csv"
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def prometheus(trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PromQLSource, np.ndarray]]:
    prometheus, promtool = require_binary("prometheus"), require_binary("promtool")
    base = tmp_path_factory.mktemp("prom")
    times = read_request_times(trace)
    # the counter a serving engine exports (vLLM's name), sampled every second as a 1 s scrape would see it
    seconds = np.arange(np.floor(times[0]), np.ceil(times[-1]) + 11)
    counts = np.searchsorted(times, seconds, side="right")
    lines = ["# TYPE vllm:request_success counter"]
    lines += [f'vllm:request_success_total{{model_name="llm"}} {c} {int(t)}' for t, c in zip(seconds, counts,
                                                                                             strict=True)]
    metrics = base / "requests.om"
    metrics.write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(metrics), str(base / "tsdb")],
                   check=True, capture_output=True, timeout=300)
    (base / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    port = free_port()
    log = (base / "prometheus.log").open("w")
    process = subprocess.Popen([prometheus, f"--config.file={base / 'prometheus.yml'}",
                                f"--storage.tsdb.path={base / 'tsdb'}", "--storage.tsdb.retention.time=100y",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                               stdout=log, stderr=subprocess.STDOUT)
    source = PromQLSource(f"http://127.0.0.1:{port}", timeout_s=60)
    try:
        source.wait_ready(timeout_s=60)
        yield source, times
    finally:
        process.terminate()
        process.wait(timeout=30)
        source.close()
        log.close()


def test_peak_rates_from_promql_match_the_trace(prometheus: tuple[PromQLSource, np.ndarray]) -> None:
    source, times = prometheus
    from_trace = peak_rates(times, INTERVAL_S)
    intervals = from_trace.size - 1  # the last, partial interval is left out
    end = times[0] + intervals * INTERVAL_S
    from_prom = peak_rates_from_prometheus(source, RATE, end, intervals, INTERVAL_S)
    expected = from_trace[:intervals]
    assert from_prom.shape == expected.shape and expected.min() > 0
    # PromQL evaluates 10 s rates every 10 s on a grid that need not match the trace's windows, so the busiest
    # window differs a little; a wrong window, step or alignment would be off by far more
    relative = np.abs(from_prom - expected) / expected
    assert float(np.median(relative)) < 0.15, list(zip(from_prom.round(2), expected.round(2), strict=True))
    assert float(np.corrcoef(from_prom, expected)[0, 1]) > 0.8


def test_more_than_one_series_and_a_bad_query_are_one_line(prometheus: tuple[PromQLSource, np.ndarray]) -> None:
    source, times = prometheus
    end = times[0] + 3 * INTERVAL_S
    with pytest.raises(VigilInputError, match="gives 2 series"):
        peak_rates_from_prometheus(source, "rate(vllm:request_success_total[10s]) or vector(1)", end, 3, INTERVAL_S)
    with pytest.raises(VigilInputError, match="rejected query"):
        peak_rates_from_prometheus(source, "sum(rate(", end, 3, INTERVAL_S)


def test_cli_plans_from_prometheus(prometheus: tuple[PromQLSource, np.ndarray], tmp_path: Path) -> None:
    source, times = prometheus
    env = dict(os.environ, PYTHONPATH=str(REPO), VIGIL_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "vigil", "tide", "plan", "--promql", source.base_url,
                           "--query", RATE, "--at", f"{times[0] + 6 * INTERVAL_S:.0f}", "--lookback", "30m",
                           "--gpus", "400", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"intervals"' in done.stdout
    both = subprocess.run([sys.executable, "-m", "vigil", "tide", "plan", "--promql", source.base_url, "--trace",
                           "x.csv"], capture_output=True, text=True, env=env, timeout=120)
    assert both.returncode == 2 and "either --trace or --promql" in both.stderr
