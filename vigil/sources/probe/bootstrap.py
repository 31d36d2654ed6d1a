"""Entry point of every rank started by `vigil launch`: install the probe, then run the script as __main__.

Run as ``python -m vigil.sources.probe.bootstrap SCRIPT [ARGS...]``; the script is not modified.
"""

from __future__ import annotations

import os
import runpy
import sys

from vigil.sources.probe import install


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m vigil.sources.probe.bootstrap SCRIPT [ARGS...]\n")
        raise SystemExit(2)
    script = argv[0]
    install()
    sys.argv = list(argv)
    # As `python SCRIPT` would: the script's own directory comes first on the import path.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
