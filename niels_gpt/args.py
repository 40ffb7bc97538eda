"""Argument types shared by every subcommand, so one flag reads the same wherever it appears."""

from __future__ import annotations

import argparse
import os
import sys

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
