"""`python -m vigil` is the `vigil` command."""

from vigil.faces.cli.main import main

main()
