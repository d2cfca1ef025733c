"""The one family of errors a user can fix.

Anything raised as a ``UserError`` (or a subclass) is a problem with the user's input: a config value, a
data file, a checkpoint, the disk. The command-line entry point catches this family once and prints one
line that says what to do, with exit code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user fixes (config, data, checkpoint, disk); its message says how, in one line."""

    exit_code = 2


class RunInterrupted(UserError):
    """The user stopped a run (Ctrl-C); the message says how to resume it."""

    exit_code = 130
