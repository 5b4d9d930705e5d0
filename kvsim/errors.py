"""The one error type a user sees: a one-line message naming the file, key or line at fault.

The CLI turns it into `kvsim: error: <message>` and exit code 2, with no traceback.
"""


class KvsimError(Exception):
    """Bad input or an impossible configuration, reported to the user in one line."""
