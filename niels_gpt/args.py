"""Argument types shared by every subcommand, so one flag reads the same wherever it appears."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_SUFFIXES = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("GB", 2**30), ("MB", 2**20), ("KB", 2**10))


def int_arg(text: str) -> int:
    """Integers as 200_000_000, 200000000 or 128MB/128MiB-style byte counts."""
    t = text.strip().replace("_", "")
    try:
        for suffix, mult in _SUFFIXES:
            if t.endswith(suffix):
                return int(float(t[: -len(suffix)]) * mult)
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer (write 200000000, 200_000_000 or a size such as 128MiB)") from None


def optional_int_arg(text: str) -> int | None:
    """`int_arg`, or None for none/off/0."""
    return None if text.lower() in ("none", "off", "0") else int_arg(text)


def command_of(argv: list[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not a flag or the global flag's value), else None."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--network-timeout":
            skip = True
        elif not word.startswith("-"):
            return word
        elif word in ("-h", "--help", "--version"):
            return None
    return None


MATRIX_COMMANDS = ("train", "sample")  # the commands that multiply matrices (see quiet_blas)


def quiet_blas(argv: list[str]) -> None:
    """Before a command line imports numpy: numpy's OpenBLAS starts a thread per core that spins for about 0.1 s
    of CPU once loaded, taking a core from a build's encoders on a small machine; only the commands that run a
    model (MATRIX_COMMANDS) multiply matrices, so the others get one BLAS thread (a user's own setting stays)."""
    if command_of(argv) not in MATRIX_COMMANDS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def exit_with(code: int) -> None:
    """Leave the process with `code`. After Ctrl-C (130) the exit hooks run (producers joined, pins and
    temporaries removed, output flushed), then the process ends without C++ static destructors: a torch
    thread pool interrupted inside an operation aborts there ("terminate called without an active
    exception", SIGABRT) instead of exiting 130."""
    if code != 130:
        sys.exit(code)
    import atexit
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def program_name(argv0: str | None = None) -> str:
    """How the user called us: the console script by its name, else the module form."""
    path = Path(sys.argv[0] if argv0 is None else argv0)
    if path.name == "__main__.py" and path.parent.name == "niels_gpt":
        return "python -m niels_gpt"
    if path.name.startswith("niels-gpt"):
        return path.name
    return "python -m niels_gpt.cache.cli" if path.parent.name == "cache" else "python -m niels_gpt.cli"


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("niels_gpt")
    except PackageNotFoundError:
        return "unknown (not installed)"


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, except on/off flags and options without one."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, argparse.SUPPRESS) or action.nargs == 0:
            return text
        if "(default" in text or "; default:" in text:  # the help names its default (%(default)s too)
            return text
        if isinstance(action.default, int) and not isinstance(action.default, bool) and action.default >= 2**53:
            return f"{text} (default: all)"  # an "unlimited" sentinel, not a number anyone would type
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text, width, indent):
        # NOTE: lines indented by two spaces (a table, such as convert's formats and the programs that read
        # them) stay as written; the prose around them is filled as before
        out, prose = [], []
        for line in [*text.splitlines(), ""]:
            if line.startswith("  ") or not line.strip():
                if prose:
                    out.append(super()._fill_text(" ".join(prose), width, indent))
                    prose = []
                if line.strip():
                    out.append(indent + line)
            else:
                prose.append(line)
        return "\n".join(out)

    def _split_lines(self, text, width):
        # NOTE: argparse wraps at hyphens too, which cuts values such as CC-MAIN-2024-10 in two.
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)


def hidden_alias(parser, old: str, primary: argparse.Action) -> None:
    """Accept `old`, an earlier spelling of `primary`'s flag, without showing it in --help: one name per idea
    in the help, every older command line still parses."""
    parser.add_argument(old, dest=primary.dest, type=primary.type, choices=primary.choices, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
