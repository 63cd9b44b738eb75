"""The user-facing error: the CLI prints its message as one line and exits non-zero."""


class LinearizeError(Exception):
    """A problem with the user's input; the message says what to do."""
