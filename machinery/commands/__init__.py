"""One command line per chapter: every argparse table, and every message that names a flag the
user typed.

Every chapter's stub imports a module of this package, so this is where a closed pipe is handled
once for all of them: `python scaling.py budget 1e20 | head -1` makes head exit after one line,
and our next write fails with BrokenPipeError. Like other command-line tools, the command then
stops without a traceback (exit 1)."""

import os
import sys

_print_the_traceback = sys.excepthook


def _stop_quietly_when_the_reader_leaves(kind, error, trace):
    if not issubclass(kind, BrokenPipeError):
        _print_the_traceback(kind, error, trace)
        return
    # stdout now points at /dev/null, so Python's last flush at exit cannot fail a second time
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


sys.excepthook = _stop_quietly_when_the_reader_leaves
