"""The one resume protocol, and the distributed context, that every dataset and loader shares.

A resume state is a JSON-able dict with a `kind`, a `version` and the `fingerprint` of its data;
`check_state` refuses another kind, version or dataset (naming both fingerprints), so one corpus's
checkpoint never drives another's loader. A dataset names its data with a `fingerprint()` method.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os

from niels_gpt.errors import ConfigError, StateError

STATE_VERSION = 1
ORDER_PEEK = 8  # global sample ids whose digest a state carries: the next ones it will deliver


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill missing rank/world_size from the distributed context (torch.distributed when initialised, else
    RANK/WORLD_SIZE, else 0 and 1) and check 0 <= rank < world_size."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} / world_size {world_size}: need world_size >= 1 and 0 <= rank < world_size")
    return rank, world_size


def fingerprint(*parts: object) -> str:
    """16 hex digits of sha256 over the JSON of `parts` (sorted keys): stable across processes."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def dataset_fingerprint(dataset) -> str:
    """A dataset's own `fingerprint`; a `range` and torch's ConcatDataset (of named datasets) name themselves.
    A dataset without one is refused: its length alone would let one dataset's state load into another."""
    if isinstance(dataset, range):
        return fingerprint("range", dataset.start, dataset.stop, dataset.step)
    parts = getattr(dataset, "datasets", None)
    if type(dataset).__name__ == "ConcatDataset" and isinstance(parts, list):
        return fingerprint("concat", [dataset_fingerprint(d) for d in parts])
    fp = getattr(dataset, "fingerprint", None)
    if callable(fp):
        fp = fp()
    if isinstance(fp, str):
        return fp
    raise ConfigError(f"{type(dataset).__name__} does not name its content (no fingerprint() method returning a "
                      "str), so a resume state could load into other data of the same length: give the dataset a "
                      "fingerprint(), e.g. a sha256 over its files' records")


def cache_fingerprint(dataset, directory, meta: dict, T) -> str:
    """The identity of a cache reader's data: its class, the directory's name, each file's sha256 and T.
    A moved cache still matches; a rebuilt one, or another T, does not."""
    files = {k: v.get("sha256") for k, v in meta.get("files", {}).items()}
    return fingerprint(type(dataset).__qualname__, str(directory).rstrip("/").split("/")[-1], files, T)


def check_state(state: object, *, kind: str, fingerprint: str | None, fields: tuple[str, ...]) -> dict:
    """Validate a resume state before any of it is used; returns it as a dict (fingerprint None: any data)."""
    if not isinstance(state, dict):
        raise StateError(f"{kind} state: expected a dict from state_dict(), got {type(state).__name__}")
    if state.get("kind") != kind:
        raise StateError(f"{kind} state: this state was written by {state.get('kind')!r}; "
                         "pass the state_dict() of the same kind of loader")
    if state.get("version") != STATE_VERSION:
        raise StateError(f"{kind} state: version {state.get('version')!r}, this code reads version "
                         f"{STATE_VERSION}; restart from the beginning of the epoch or use the matching release")
    missing = [f for f in fields if f not in state]
    if missing:
        raise StateError(f"{kind} state: missing field(s) {', '.join(missing)}; the state is truncated or hand-edited")
    if fingerprint is not None and state.get("fingerprint") != fingerprint:
        raise StateError(f"{kind} state: dataset fingerprint {state.get('fingerprint')!r} does not match this "
                         f"dataset's {fingerprint!r}; the checkpoint belongs to other data (or other T/seed): "
                         "resume with the data it was written for")
    return state


def check_peer_state(state: object, *, kind: str, fingerprint: str, fields: tuple[str, ...], expect: dict) -> dict:
    """A resume state for a dataset with a peer's semantics (MemoryMappedDataset, NanogptDataset): ours gets
    `check_state`; the peer's own (no `kind`) is taken after each field of `expect` it has is compared."""
    if not isinstance(state, dict):
        raise StateError(f"{kind} state: expected a dict from state_dict(), got {type(state).__name__}")
    for key, mine in expect.items():
        if key in state and state[key] != mine:
            raise StateError(f"{kind} state has {key}={state[key]!r} but this dataset has {mine!r}: it was saved "
                             "for another corpus or configuration; resume with the same data")
    if "kind" in state:
        check_state(state, kind=kind, fingerprint=fingerprint, fields=fields)
    return state


def state_int(kind: str, state: dict, field: str, *, minimum: int | None = 0) -> int:
    """state[field] as an int, refused unless it is an integer (not a bool, not 2.5) >= `minimum`."""
    value = state[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or (minimum is not None and value < minimum):
        need = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise StateError(f"{kind} state: {field} = {value!r}; expected {need}: the state is hand-edited or "
                         "corrupt, resume from the state_dict() the loader wrote")
    return int(value)


def state_ints(kind: str, state: dict, field: str, *, length: int | None = None) -> list[int]:
    """state[field] as a list of ints >= 0 (of `length` items when given)."""
    values = state[field]
    if not isinstance(values, (list, tuple)) or (length is not None and len(values) != length):
        need = "a list" if length is None else f"a list of {length}"
        raise StateError(f"{kind} state: {field} = {values!r}; expected {need} of integers >= 0: the state is "
                         "hand-edited or corrupt, resume from the state_dict() the loader wrote")
    return [state_int(kind, {f"{field}[{i}]": v}, f"{field}[{i}]") for i, v in enumerate(values)]


def state_floats(kind: str, state: dict, field: str, *, length: int) -> list[float]:
    """state[field] as a list of `length` finite numbers."""
    values = state[field]
    if (not isinstance(values, (list, tuple)) or len(values) != length
            or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) for v in values)):
        raise StateError(f"{kind} state: {field} = {values!r}; expected a list of {length} finite numbers: the "
                         "state is hand-edited or corrupt, resume from the state_dict() the loader wrote")
    return [float(v) for v in values]


def order_record(ids, **config) -> dict:
    """What a state says about its order: `config` (the order's code version, seed, data fingerprint, batch
    size...) and the digest of `ids`, the next global sample ids it will deliver."""
    return {**config, "digest": fingerprint([int(i) if isinstance(i, numbers.Integral) else i for i in ids])}


def saved_order(kind: str, state: object) -> dict | None:
    """The state's order record; None for a state written before states carried one."""
    record = state.get("order") if isinstance(state, dict) else None
    if record is not None and not isinstance(record, dict):
        raise StateError(f"{kind} state: order = {record!r}; expected a dict from state_dict(): the state is "
                         "hand-edited or corrupt")
    return record


def check_order_config(kind: str, saved: dict | None, mine: dict) -> None:
    """Refuse a state whose order was made with another config (names each difference) before it is used."""
    if saved is None:
        return
    differs = [f"{key} {saved.get(key)!r} -> {value!r}" for key, value in mine.items()
               if key != "digest" and saved.get(key) != value]
    if differs:
        raise StateError(f"{kind} state: the order would change ({'; '.join(differs)}, state -> this run): resume "
                         "with the state's settings and data, or pass allow_new_order=True to go on from the same "
                         "position in the new order")


def check_order_digest(kind: str, saved: dict | None, mine: dict) -> None:
    """Refuse a state whose next samples are not the ones this code would deliver from its position."""
    if saved is not None and saved.get("digest") != mine["digest"]:
        raise StateError(f"{kind} state: the next {ORDER_PEEK} samples this code delivers from the state's position "
                         f"differ from the state's (digest {saved.get('digest')!r} -> {mine['digest']!r}) with the same "
                         "settings: the order's code changed (or the position was edited); resume with the "
                         "release that wrote the state, or pass allow_new_order=True to go on from the same "
                         "position in the new order")
