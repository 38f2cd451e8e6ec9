"""The launcher's own lines on stderr.

The ranks' output reaches the same terminal or pipe as tfringrun's lines. A
``print(..., file=sys.stderr)`` writes the text and its newline in two
writes, so a rank's line could land between them and be glued to the end of
tfringrun's line, where nothing reading the output line by line finds it.
Every launcher line is written here whole, in one write.
"""

import sys


def say(message):
    """Writes ``tfringrun: MESSAGE`` and its newline to stderr in one write.

    Args:
        message: the text after the ``tfringrun: `` prefix, without a newline.

    Returns:
        None.

    Raises:
        Nothing of its own; an OSError from stderr passes through.

    Example:
        >>> say("rank 0 exited with code 1")  # doctest: +SKIP
    """
    sys.stderr.write(f"tfringrun: {message}\n")
    sys.stderr.flush()
