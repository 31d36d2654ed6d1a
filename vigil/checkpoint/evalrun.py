"""Run one checkpoint evaluation and leave its result in a file, whoever is (still) watching.

``python -m vigil.checkpoint.evalrun ATTEMPT_DIR LOCK_FD -- COMMAND...`` runs COMMAND with its output in
ATTEMPT_DIR/stdout and stderr, then writes ATTEMPT_DIR/result.json (exit status, the scalars of the last
stdout line that is a JSON object of numbers, times) through a rename, so a reader sees all of it or none.
LOCK_FD is the attempt's locked file, inherited from the watcher and passed on to COMMAND: the lock is free
only once nothing of the attempt runs. Standard library only, so it starts fast.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

RESULT_FILE = "result.json"
LOCK_FILE = "lock"


def scalars_from(stdout: str) -> dict[str, float]:
    """The last line that parses as a JSON object whose values are all finite numbers."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(data, dict)
            and data
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in data.values())
        ):
            return {str(k): float(v) for k, v in data.items()}
    return {}


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not argv[1].isdigit():
        print("usage: python -m vigil.checkpoint.evalrun ATTEMPT_DIR LOCK_FD -- COMMAND...", file=sys.stderr)
        return 2
    attempt_dir, lock, command = Path(argv[0]), int(argv[1]), argv[3:]
    started = time.time()
    out_path, err_path = attempt_dir / "stdout", attempt_dir / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        try:
            returncode: int | None = subprocess.call(
                command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, pass_fds=(lock,)
            )
            message = "" if returncode == 0 else f"exit status {returncode}"
        except OSError as error:
            returncode, message = 127, f"cannot run {command[0]}: {error.strerror}"
    stdout = out_path.read_text(errors="replace")
    if returncode != 0 and not message:
        message = f"exit status {returncode}"
    if returncode:
        tail = err_path.read_text(errors="replace").strip().splitlines()[-1:]
        message = f"{message}: {tail[0][:500]}" if tail else message
    result = {
        "returncode": returncode,
        "metrics": scalars_from(stdout),
        "message": message,
        "started": started,
        "ended": time.time(),
    }
    tmp = attempt_dir / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, attempt_dir / RESULT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
