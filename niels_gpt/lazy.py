"""Names a package imports on first use (PEP 562): importing the package imports none of its heavy modules."""

import importlib


def lazy_names(namespace: dict, homes: dict[str, str]):
    """A package's `__getattr__` and `__dir__`: each name of `homes` is imported from its module there (relative to
    the package whose globals are `namespace`) on first use, then kept in `namespace`."""
    package = namespace["__name__"]

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
