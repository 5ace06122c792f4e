"""The `astraflow` command: thin typer entry points that parse, then call one function."""
