from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.config import load_settings
from vigil.model import VigilInputError


def test_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "vigil.yaml"
    path.write_text("home: /srv/vigil\nmax_cordon_share: 0.05\n")
    cfg = load_settings(path, max_cordon_share=0.2)
    assert cfg.home == Path("/srv/vigil") and cfg.max_cordon_share == 0.2
    assert cfg.database_url() == "sqlite:////srv/vigil/vigil.db"


@pytest.mark.parametrize(("text", "message"), [
    ("home: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "mapping"),
    ("max_cordon_share: lots\n", "'max_cordon_share'"),
    ("max_cordon_share: 3\n", "'max_cordon_share'"),
])
def test_corrupt_config_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "vigil.yaml"
    path.write_text(text)
    with pytest.raises(VigilInputError, match=message) as info:
        load_settings(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_config_file() -> None:
    with pytest.raises(VigilInputError, match="does not exist"):
        load_settings(Path("/nonexistent/vigil.yaml"))


def test_cli_reports_a_corrupt_config_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "vigil.yaml"
    path.write_text("max_cordon_share: lots\n")
    env = {**os.environ, "VIGIL_CONFIG": str(path)}
    proc = subprocess.run([sys.executable, "-m", "vigil", "incidents"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2
    assert "max_cordon_share" in proc.stderr and "Traceback" not in proc.stderr
