"""Optional C kernels, compiled by `pip install` where a C compiler and the Python headers exist.

`gather` is the extension module built from gather.c (the fused window gather behind
PretrainTokenStreamDataset.get_batch: token windows -> int64 x and y in one pass; batches ~2.3x
faster than numpy's gather-then-cast; and ids_to_tokens / arrays_to_tokens, the cache writer's id
conversion of lists / of the fast encoder's uint32 arrays), or None when it is missing: not built (no compiler, no
headers, a platform it does not compile on), failing to load, or a stale build from an older gather.c
(its ABI number is not ABI). Callers then take their numpy path, which produces byte-identical
batches. `UNAVAILABLE` says why it is None. Setting NIELS_GPT_NO_NATIVE=1 in the environment forces
the numpy path (to compare or bisect). Loading costs one dlopen at first import; nothing is compiled
at run time. After editing gather.c, rebuild with `pip install -e .` (and bump ABI in both files
when a signature or meaning changes).
"""

from __future__ import annotations

import importlib
import os

ABI = 3  # must equal NATIVE_ABI in gather.c: bump both when a kernel's signature or meaning changes
NO_NATIVE_ENV = "NIELS_GPT_NO_NATIVE"


def _load():
    if os.environ.get(NO_NATIVE_ENV, "") not in ("", "0"):
        return None, f"{NO_NATIVE_ENV} is set"
    try:
        _gather = importlib.import_module(f"{__name__}._gather")
    except ImportError as e:  # not built, or built for another Python / platform
        return None, f"niels_gpt._native._gather is not built or does not load ({e}); " \
                     "reinstall with a C compiler (`pip install -e .`) to build it"
    except Exception as e:  # a broken shared object: never let it break importing the reader
        return None, f"niels_gpt._native._gather failed to initialise: {e!r}"
    found = getattr(_gather, "ABI", None)
    if found != ABI:
        where = getattr(_gather, "__file__", _gather.__name__)
        return None, f"{where} is a stale build (ABI {found}, expected {ABI}): " \
                     "rebuild it with `pip install -e .`"
    return _gather, None


gather, UNAVAILABLE = _load()
