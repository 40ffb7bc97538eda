"""A build's work directory in an object store (s3://, gs://, ...): plan, parts and receipts at a URL.

    <work>/plan.json                        the driver's plan (with the output it builds)
    <work>/parts/<id>.bin|.mask.bin|...     each task's parts, then its receipt <id>.json, last
    <work>/tokenizer/<sha256>/<files>       the tokenizer the tasks fetch, once per node (`fetch_tokenizer`)

The same names as a local work directory (builders/tasks.py). Object stores have no rename: an object
appears whole when its upload ends, so the receipt, uploaded last, vouches for the parts before it.
Cost: `python bench/bench_store_build.py` (docs/scale.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from niels_gpt.constants import META_NAME
from niels_gpt.errors import ConfigError, StorageError, first_few
from niels_gpt.storage.fs import call, filesystem, join, read_bytes
from niels_gpt.storage.local_cache import TOKENIZERS, claim, file_lock
from niels_gpt.storage.settings import MIRRORS, local_cache_dir, network_timeout_s

TOKENIZER_DIR = "tokenizer"
TASK_DIRS = "niels_gpt_task_"  # the prefix of a task's own temporary directory on a worker
# what a work URL may hold: our plan, parts and receipts (and temporaries), the tokenizer we uploaded
OURS = re.compile(r"^(plan\.json|parts/\d{5,}-[0-9a-f]{12}\.(bin|mask\.bin|lens\.npy|origins\.npy|json|started)"
                  r"|tokenizer/[0-9a-f]{64}/[^/]+)$")
# the files beside a tokenizer model that loading it may read (its record, its chat template)
TOKENIZER_SIBLINGS = (META_NAME, "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


class WorkStore:
    """The work directory at `url`: bounded, retried calls on its objects, each error naming the address."""

    def __init__(self, url: str):
        self.url = str(url).rstrip("/")
        self.fs, self.root = filesystem(self.url, write=True)

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def _write(self, what: str, method: str, *args):
        try:
            return call(self.fs, what, method, *args)
        except FileNotFoundError as exc:  # an object store's answer to a bucket that does not exist
            raise StorageError(f"{what}: the bucket or container does not exist ({exc}); create it, or give "
                               "--work-dir a prefix in one you can write") from None

    def list(self) -> dict[str, int]:
        """rel -> size of every object under the work URL (empty when there is none)."""
        self._fresh("")  # what other nodes wrote since: never a listing of before
        try:
            found = call(self.fs, f"listing {self.url}", "find", self.root, None, False, True)
        except FileNotFoundError:
            return {}
        top = self.root + "/"
        return {name[len(top):]: int(info.get("size") or 0) for name, info in (found or {}).items() if name.startswith(top)}

    def sizes(self, sub: str) -> dict[str, int]:
        """name -> size of the objects directly under `sub`."""
        return {k[len(sub) + 1:]: v for k, v in self.list().items() if k.startswith(sub + "/")
                and "/" not in k[len(sub) + 1:]}

    def get_bytes(self, rel: str) -> bytes:
        """The object's bytes; FileNotFoundError when there is none."""
        self._fresh(rel)
        return read_bytes(self.fs, join(self.root, rel), f"reading {self.where(rel)}")

    def put_bytes(self, rel: str, data: bytes) -> None:
        self._write(f"writing {self.where(rel)}", "pipe_file", join(self.root, rel), data)

    def put_file(self, local: str | os.PathLike, rel: str) -> None:
        self._write(f"uploading {local} to {self.where(rel)}", "put_file", os.fspath(local), join(self.root, rel))

    def _fresh(self, rel: str) -> None:
        """Forget the backend's cached listing above `rel` (s3fs answers from it): another node may have
        written the object since this process listed the prefix."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(join(self.root, rel))

    def get_file(self, rel: str, local: str | os.PathLike) -> None:
        self._fresh(rel)
        call(self.fs, f"downloading {self.where(rel)}", "get_file", join(self.root, rel), os.fspath(local))

    def remove(self, *rels: str) -> None:
        """Delete these objects (missing ones are no error): one request per thousand on a store that deletes in
        bulk (s3, gs), not one each (2,000 parts: 0.19 s against 10.9 s on a local S3 server)."""
        if not rels:
            return
        more = f" and {len(rels) - 1:,} more" if len(rels) > 1 else ""
        try:
            call(self.fs, f"removing {self.where(rels[0])}{more}", "rm", [join(self.root, r) for r in rels])
        except FileNotFoundError:  # one of them is gone already: a store without bulk deletes stopped there
            if len(rels) > 1:
                for rel in rels:
                    self.remove(rel)


def check_work_url(store: WorkStore, out: str, flag: str = "--work-dir") -> tuple[bool, dict[str, int]]:
    """The output guard for a work URL: nothing there, or the work files of a build of this same output
    (anything else is refused). Returns (whether a run of this build made the prefix, the objects there)."""
    found = store.list()
    if not found:
        return True, found
    theirs = sorted(k for k in found if not OURS.match(k) and ".tmp-" not in k)
    if theirs:
        raise ConfigError(f"{flag} {store.url}: holds {len(theirs)} object(s) that are not a build's work files "
                          f"({first_few(theirs)}); nothing there is deleted or replaced: choose a new prefix, "
                          "or remove them yourself")
    plan: dict = {}
    if "plan.json" in found:
        try:
            plan = json.loads(store.get_bytes("plan.json"))
        except ValueError:
            plan = {}
        if not isinstance(plan, dict):
            plan = {}
        if plan.get("out") != out:
            raise ConfigError(f"{flag} {store.url}: holds the plan of a build of {plan.get('out') or 'another output'}"
                              f", not of {out}; its parts are that build's: choose another {flag}, or remove that "
                              "prefix yourself once that build is done")
    return plan.get("work_dir_created") is True, found


def fetch_tokenizer(url: str, sha256: str) -> Path:
    """The tokenizer model at `url` (and its siblings) as a local path in this node's download cache,
    downloaded once per node (a lock, then a rename)."""
    folder, _, model = url.rstrip("/").rpartition("/")
    root = local_cache_dir()
    claim(root)
    final = root / MIRRORS / TOKENIZERS / sha256
    if (final / model).is_file():
        return final / model
    with file_lock(root / "locks" / "tokenizers" / f"{sha256}.lock", timeout_s=4 * network_timeout_s(),
                   what=f"fetching the tokenizer {url}"):
        if (final / model).is_file():
            return final / model
        store = WorkStore(folder)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{sha256[:16]}.", suffix=f".tmp-{os.getpid()}", dir=final.parent))
        try:
            for name in sorted(k for k in store.list() if "/" not in k):
                store.get_file(name, tmp / name)
            shutil.rmtree(final, ignore_errors=True)  # a folder without its model: an older fetch cut short
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final / model


def upload_tokenizer(store: WorkStore, model_path: str, sha256: str, found: dict[str, int]) -> str:
    """Upload the tokenizer model and its siblings to `<work>/tokenizer/<sha256>/` unless there; its URL."""
    model = Path(model_path)
    rel = f"{TOKENIZER_DIR}/{sha256}"
    names = [model.name] + [n for n in TOKENIZER_SIBLINGS if (model.parent / n).is_file() and n != model.name]
    for name in names[1:] + names[:1]:  # the model last: once it is there, the folder is whole
        if f"{rel}/{name}" not in found:
            store.put_file(model.parent / name, f"{rel}/{name}")
    return store.where(f"{rel}/{model.name}")
