class SoftsynError(Exception):
    """A user-facing error: the CLI prints its message and exits with code 2, without a traceback."""
