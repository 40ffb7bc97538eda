"""--map and --min-chars: a user's function run on every document or conversation, and a length filter."""

from __future__ import annotations

from niels_gpt.errors import ConfigError, SourceError


def record_hook(spec: str):
    """The function `module:function` names (--map), imported here, so every executor's workers run it."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"--map {spec}: give MODULE:FUNCTION, e.g. --map my_filters:clean")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(f"--map {spec}: cannot import {module!r} ({exc}); put it on PYTHONPATH (every worker "
                          "imports it too)") from None
    except AttributeError:
        raise ConfigError(f"--map {spec}: module {module!r} has no {name!r}; check the function's name") from None
    if not callable(fn):
        raise ConfigError(f"--map {spec}: {module}.{name} is not a function")
    return fn


def mapped(hook, item, spec: str):
    out = hook(item)
    if out is None or isinstance(out, str) == isinstance(item, str) and (
            isinstance(out, str) or (isinstance(out, list) and all(isinstance(m, dict) for m in out))):
        return out
    want = "text (str)" if isinstance(item, str) else "a list of {\"role\", \"content\"} messages"
    raise SourceError(f"--map {spec}: returned {type(out).__name__} ({out!r:.60}); it must return {want}, or None "
                      "to drop the record")


def chars(item) -> int:
    if isinstance(item, str):
        return len(item)
    return sum(len(m.get("content") or "") for m in item if isinstance(m, dict))
