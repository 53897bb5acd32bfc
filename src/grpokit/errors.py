"""The one exception type for mistakes a user can fix (bad config, data, paths, servers)."""

from __future__ import annotations


class UserError(Exception):
    """A problem in the user's input, stated so they can fix it.

    The CLI prints the message (no traceback) and exits with code 2. The message should name the
    file, line or field, say what is wrong, and what to do.
    """
