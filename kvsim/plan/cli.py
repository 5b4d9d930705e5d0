"""The `plan` and `sweep` commands."""


def add_commands(sub) -> None:
    """Register this package's subcommands on the `kvsim` parser."""
