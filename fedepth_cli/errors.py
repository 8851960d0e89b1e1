"""The user error of the ``fedepth`` command: one line on stderr, exit status 2."""


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""
