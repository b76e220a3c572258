"""The command-line helpers every chapter's CLI shares: no lesson here, only the rule that a bad
input gets one line naming the flag and the fix, exit code 2, before any work starts.

- `Parser`: argparse that reports a bad argument in one line, without the usage block.
- `in_range`, `writable`: argparse types for a bounded number and an output path (checked,
  nothing created).
- `run`: calls a command; the library's own errors become that one line and exit code 2.
- `add_arguments`, `add_commands`: a parser's flags, and a file's subcommands, from a table, so a
  command line reads as one table of flags instead of a page of `add_argument` calls.
- `help_only`: the command line of a file with no commands of its own (this one's too).

Library code raises in library terms (the value and the fix); the CLI adds the flag's name.
Only a `main()` or a parser builder imports this file (inside the function), so a chapter
imported for its lesson never loads it.

Depends on fileio.py (an output path's links and name lengths, `writable`) and the standard
library.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def in_range(kind=int, low=None, high=None, low_open=False, high_open=False, rule=None):
    """argparse type: a finite int or float within the bounds (open ends with low_open/high_open).
    A bad value is told "must be <rule>"; `rule` defaults to the bounds, and a caller with a unit
    and an example to show gives its own.

    >>> in_range(float, 0.0, 1.0, low_open=True)("0.5")
    0.5
    >>> in_range(int, 0)("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 0, got '-1'
    >>> in_range(float, 1.0, 1e15, rule="1 to 1e+15 parameters, e.g. 7e9")("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be 1 to 1e+15 parameters, e.g. 7e9, got '0'
    """

    def show(x):
        return f"{x:g}" if isinstance(x, float) else str(x)

    bounds = [
        f"{'>' if low_open else '>='} {show(low)}" if low is not None else "",
        f"{'<' if high_open else '<='} {show(high)}" if high is not None else "",
    ]
    rule = rule or ("an integer " if kind is int else "a number ") + " and ".join(
        filter(None, bounds)
    )

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or low is not None
            and (value < low or low_open and value == low)
            or high is not None
            and (value > high or high_open and value == high)
        ):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    return parse


def writable(kind="file", elsewhere=None):
    """argparse type: a path where a `kind` ("file" or "dir") can be written. Checks only,
    creates nothing, so a bad output path (a symbolic link that loops or points nowhere, a name
    over 255 bytes: `fileio.output_path_problem`) fails before any work. `elsewhere(text)` true:
    a path another check owns (an object store's URI), passed through.

    >>> writable("dir")("out/run")
    'out/run'
    >>> writable("file")(".")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: . is a directory: give a file path
    """

    def parse(text: str) -> str:
        if elsewhere is not None and elsewhere(text):
            return text
        from machinery import fileio

        problem = fileio.output_path_problem(text)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}: give another path")
        path = pathlib.Path(text)
        if path.is_dir() if kind == "file" else path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text} is a {'directory' if kind == 'file' else 'file'}: "
                f"give a {'file' if kind == 'file' else 'directory'} path"
            )
        here = path.absolute()
        parent = next(
            p for p in ((here, *here.parents) if kind == "dir" else here.parents) if p.exists()
        )
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(
                f"cannot write {text}: {parent} is "
                f"{'a file' if not parent.is_dir() else 'read-only'}"
            )
        return text

    return parse


def run(command, errors: tuple, prog: str | None = None) -> int:
    """Call `command()` and return its exit code (None: 0); one of `errors` (the library's own)
    becomes one line on stderr, `prog: error: ...` (or `error: ...`), and exit code 2. An OSError in
    `errors` (unreadable input, a full disk) is told by its path and errno text.

    >>> def bad():
    ...     raise ValueError("--lr must be > 0, got -1")
    >>> run(bad, (ValueError,), "x.py")
    2
    >>> run(lambda: None, (ValueError,))
    0
    """
    try:
        return command() or 0
    except BrokenPipeError:
        raise  # the reader of our output left (`| head`): machinery/commands stops quietly
    except errors as e:
        text = (
            f"{e.filename or ''}: {e.strerror or e}; check the path and its permissions"
            if isinstance(e, OSError)
            else e
        )
        print(f"{prog}: error: {text}" if prog else f"error: {text}", file=sys.stderr)
        return 2


def add_arguments(parser, flags) -> None:
    """Add each `(name, options)` of `flags` to `parser`: `parser.add_argument(name, **options)`;
    a tuple of names (`("-o", "--out")`) gives them all.

    >>> p = Parser(prog="x")
    >>> add_arguments(p, [("n", {"type": int}), ("--quick", {"action": "store_true"})])
    >>> p.parse_args(["3", "--quick"])
    Namespace(n=3, quick=True)
    """
    for names, options in flags:
        parser.add_argument(*((names,) if isinstance(names, str) else names), **options)


def add_commands(sub, commands: dict) -> dict:
    """Add one subcommand per entry of `commands`, `{name: (help, run, flags)}`, to the subparsers
    `sub`: its flags as in `add_arguments`, and `run` (the function the command calls with the
    parsed arguments) as its default `args.run`. Returns the subcommands' parsers by name, for
    flags another file adds.

    >>> p = Parser(prog="x")
    >>> parsers = add_commands(p.add_subparsers(dest="command"),
    ...                        {"double": ("print 2n", lambda a: 2 * a.n, [("n", {"type": int})])})
    >>> args = p.parse_args(["double", "21"])
    >>> args.run(args)
    42
    """
    parsers = {}
    for name, (text, command, flags) in commands.items():
        parsers[name] = sub.add_parser(name, help=text)
        add_arguments(parsers[name], flags)
        parsers[name].set_defaults(run=command)
    return parsers


def help_only(doc: str, runs: str, argv: list[str] | None = None) -> None:
    """The command line of a file with no commands of its own: with --help or no arguments it prints
    the file's docstring and `runs` (the commands that use it); any other argument is an error."""
    parser = Parser(
        description=doc, epilog=runs, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args(argv)
    parser.print_help()


if __name__ == "__main__":
    # no commands of its own: --help (or no argument) says what it is and where the commands are
    help_only(
        __doc__,
        "No commands of its own: each chapter's command line is built with it.\n"
        "The commands, each with --help:\n"
        "  python bpe.py | dedup.py | classify.py | data.py | model.py | train.py\n"
        "  python parallel.py | model_parallel.py | scaling.py | evaluate.py",
    )
