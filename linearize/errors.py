"""The user-facing error: the CLI prints its message as one line and exits non-zero."""


class LinearizeError(ValueError):
    """A problem with the user's input; the message says what to do.

    A ``ValueError`` so that library callers who catch ``ValueError`` for bad arguments keep
    working; the CLI turns only this (not every ``ValueError``) into a one-line error.
    """


class OptionError(LinearizeError):
    """An unknown method, an unknown option, or an option or setting value of the wrong type or range."""
