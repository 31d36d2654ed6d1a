"""Real processes for the live tests: each started with its output in a log and stopped when the test's stack
closes, in an environment free of the caller's Vigil settings, and asked over HTTP whether it answers."""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack
from pathlib import Path

import httpx

from tests.conftest import REPO


def start(stack: ExitStack, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = stack.enter_context(log.open("w"))
    process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)
    return process


def vigil_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(values)
    return env


def answers(url: str, token: str | None = None) -> bool:
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(url, timeout=2, headers=headers).status_code == 200
    except httpx.HTTPError:
        return False
