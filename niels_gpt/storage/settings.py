"""Where the download cache of remote caches lives, how large it may grow, how long a network wait may last
(every one: caches and input files at URLs, uploads, `download`'s shards).

| setting | environment | CLI flag (train) | Python | default |
|---|---|---|---|---|
| download cache directory | `NIELS_GPT_CACHE` | `--local-cache DIR` | `configure(cache_dir=...)` | `~/.cache/niels_gpt` |
| its size bound | `NIELS_GPT_CACHE_MAX_BYTES` | `--cache-limit 20GB` | `configure(max_bytes=...)` | 50 GiB |
| time limit of a network wait (to connect; without a byte) | `NIELS_GPT_NETWORK_TIMEOUT_S` | `--network-timeout S` (every command) | `configure(timeout_s=...)` | 30 s |

`configure` (what the flags call) wins over the environment, which wins over the default; it changes only the
settings it is given, and `reset()` gives all three back to the environment and defaults. Sizes are bytes or a
size such as `20GB` (`niels_gpt.args.int_arg`).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from niels_gpt.args import int_arg
from niels_gpt.errors import ConfigError

CACHE_ENV = "NIELS_GPT_CACHE"
MAX_BYTES_ENV = "NIELS_GPT_CACHE_MAX_BYTES"
TIMEOUT_ENV = "NIELS_GPT_NETWORK_TIMEOUT_S"
DEFAULT_CACHE_DIR = "~/.cache/niels_gpt"
DEFAULT_MAX_BYTES = 50 << 30
DEFAULT_TIMEOUT_S = 30.0  # no answer, or no byte of a transfer, for this long: one line naming the address
MIRRORS = "remote"  # <cache dir>/remote/<sha256(url)[:16]>/: one mirror per cache URL

_settings: dict = {"cache_dir": None, "max_bytes": None, "timeout_s": None}


def parse_size(text, what: str) -> int:
    """A positive byte count from an int or a size string ("20GB"); ConfigError naming `what` otherwise."""
    if isinstance(text, bool):
        value = 0
    elif isinstance(text, int):
        value = text
    else:
        try:
            value = int_arg(str(text))
        except argparse.ArgumentTypeError:
            value = 0
    if value < 1:
        raise ConfigError(f"{what}={text!r}: expected a positive number of bytes or a size such as 20GB or 512MiB")
    return value


def configure(*, cache_dir: str | os.PathLike | None = None, max_bytes: int | str | None = None,
              timeout_s: float | None = None) -> None:
    """Set the download cache's directory, its size bound or the network time limit for this process (each
    overrides its environment variable); a setting not given (None) keeps its value: `reset()` hands it back."""
    if max_bytes is not None:
        max_bytes = parse_size(max_bytes, "max_bytes")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not (math.isfinite(timeout_s) and timeout_s > 0)):
        raise ConfigError(f"timeout_s must be a positive, finite number of seconds, got {timeout_s!r}")
    if cache_dir is not None:
        _settings["cache_dir"] = os.fspath(cache_dir)
    if max_bytes is not None:
        _settings["max_bytes"] = max_bytes
    if timeout_s is not None:
        _settings["timeout_s"] = float(timeout_s)


def reset() -> None:
    """Every setting back to its environment variable, or its default."""
    _settings.update(cache_dir=None, max_bytes=None, timeout_s=None)


def snapshot() -> dict:
    """This process's settings as configure() left them, for `restore`."""
    return dict(_settings)


def restore(saved: dict) -> None:
    _settings.update(saved)


def local_cache_dir() -> Path:
    return Path(_settings["cache_dir"] or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def cache_dir_label() -> str:
    """How the user named the download cache directory: the flag (or configure), the variable, or the default."""
    if _settings["cache_dir"]:
        return "--local-cache"
    return f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "the download cache"


def max_cache_bytes() -> int:
    if _settings["max_bytes"] is not None:
        return _settings["max_bytes"]
    raw = os.environ.get(MAX_BYTES_ENV)
    return parse_size(raw, f"${MAX_BYTES_ENV}") if raw else DEFAULT_MAX_BYTES


def network_timeout_s() -> float:
    if _settings["timeout_s"] is not None:
        return _settings["timeout_s"]
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"${TIMEOUT_ENV}={raw!r}: expected a positive, finite number of seconds, e.g. 120")
    return value


def apply_cache_args(local_cache, cache_limit) -> None:
    """configure() from --local-cache / --cache-limit, each where given."""
    configure(cache_dir=local_cache, max_bytes=None if cache_limit is None else parse_size(cache_limit, "--cache-limit"))
