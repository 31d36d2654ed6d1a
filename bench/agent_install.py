"""What a node pays for the agent: `pip install '.[agent]'` into a fresh virtualenv, its size, and the agent's memory.

Run: .venv/bin/python bench/agent_install.py   -> bench/results/agent_install.json

A fresh virtualenv gets `pip install '<repo>'` (the base), then `pip install '<repo>[agent]'` (the Kubernetes
client on top): real, non-editable installs from the package index this machine is configured with. Measured after
each: the install time, the size of its site-packages, the distributions it
holds (and that none of torch, tensorboard, mcp, fastapi, SQLAlchemy is among them), the wall time of
`vigil agent --help`, and the peak RSS of one `vigil agent --once --json` collection (a dcgm-exporter page of
8 H100s over HTTP, a kernel log with one Xid, psutil host metrics, the local history). The baseline, in the
same run, is the development virtualenv this script runs in (`.[all,dev]`: what every node installed before the
extras), running the same agent commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent import serve_page  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DCGM_PAGE = REPO / "tests" / "fixtures" / "collect" / "dcgm_exporter_page.txt"
NOT_FOR_THE_AGENT = ("torch", "tensorboard", "mcp", "fastapi", "sqlalchemy")
console = Console()


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def distributions(python: Path) -> list[str]:
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; "
                          "print(json.dumps(sorted({d.metadata['Name'].lower() for d in m.distributions()})))"],
                         capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def run_measured(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) of the child, its stdout. The child is reaped with wait4 to read its own
    resource usage (not the maximum over every child this process ever had)."""
    out_path, err_path = cwd / "stdout.txt", cwd / "stderr.txt"
    started = time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=cwd,
                                env={**os.environ, "VIGIL_HOME": str(cwd / "home")})
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err_path.read_text()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, out_path.read_text()


def agent_runs(vigil: list[str], work: Path, url: str) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    kernel_log = work / "kern.log"
    kernel_log.write_text("[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=, GPU has fallen off the bus.\n")
    help_s, help_rss, _ = run_measured([*vigil, "agent", "--help"], work)
    once_s, once_rss, out = run_measured([*vigil, "agent", "--once", "--json", "--dcgm-url", url, "--kmsg-file",
                                          str(kernel_log), "--store", str(work / "history")], work)
    report = json.loads(out[out.index("{"):])
    points = sum(s["points"] for s in report["sources"])
    if report["events"] != {"xid/isolate": 1} or points == 0:
        raise SystemExit(f"the agent did not collect what it was given: {report['events']}, {points} points")
    return {"help_s": round(help_s, 2), "help_peak_rss_mib": round(help_rss, 1), "once_s": round(once_s, 2),
            "once_peak_rss_mib": round(once_rss, 1), "points": points}


def install(python: Path, target: str) -> float:
    started = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir", target], check=True)
    return time.perf_counter() - started


def measure(python: Path, vigil: list[str], work: Path, url: str, install_s: float | None) -> dict[str, object]:
    dists = distributions(python)
    leaked = sorted(set(dists) & set(NOT_FOR_THE_AGENT))
    if leaked and install_s is not None:
        raise SystemExit(f"the agent install pulled in {', '.join(leaked)}")
    return {"install_s": None if install_s is None else round(install_s, 1),
            "site_packages_mib": round(tree_bytes(site_packages(python)) / 2**20, 1),
            "distributions": len(dists), "distribution_names": dists, **agent_runs(vigil, work, url)}


def main() -> None:
    httpd = serve_page(DCGM_PAGE.read_bytes())
    url = f"http://127.0.0.1:{httpd.server_port}/metrics"
    rows: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="vigil-agent-install-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python, vigil = venv / "bin" / "python", [str(venv / "bin" / "vigil")]
        console.print(f"installing {REPO} (base) into a fresh virtualenv ...")
        rows["base"] = measure(python, vigil, Path(tmp) / "base", url, install(python, str(REPO)))
        console.print("adding the [agent] extra ...", markup=False)
        rows["agent"] = measure(python, vigil, Path(tmp) / "agent", url, install(python, f"{REPO}[agent]"))
        rows["full_dev_venv"] = measure(Path(sys.executable), [sys.executable, "-m", "vigil"], Path(tmp) / "full", url,
                                        None)
    httpd.shutdown()

    table = Table(title="vigil agent: a fresh install vs the full development install (same run)", title_justify="left")
    for col in ("install", "site-packages MiB", "distributions", "install s", "agent --help s", "--help peak RSS MiB",
                "agent --once s", "--once peak RSS MiB"):
        table.add_column(col, justify="right" if col != "install" else "left")
    labels = {"base": "pip install . (fresh venv)", "agent": r"+ \[agent] (Kubernetes client)",
              "full_dev_venv": r".\[all,dev] (this venv)"}
    for key, row in rows.items():
        install_s = row["install_s"]
        table.add_row(labels[key], f"{row['site_packages_mib']:,.0f}", str(row["distributions"]),
                      "-" if install_s is None else f"{install_s:.0f}", f"{row['help_s']:.2f}",
                      f"{row['help_peak_rss_mib']:.0f}", f"{row['once_s']:.2f}", f"{row['once_peak_rss_mib']:.0f}")
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    result = {**rows, "not_installed": list(NOT_FOR_THE_AGENT)}
    (RESULTS / "agent_install.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {RESULTS / 'agent_install.json'}")


if __name__ == "__main__":
    main()
