"""`python -m astraflow`: the `astraflow` command, for a child process that must use this interpreter."""

from astraflow.cli.app import app

app()
