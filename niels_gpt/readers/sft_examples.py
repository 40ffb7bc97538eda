"""One split of an SFT cache as numpy, checked on open, without torch: `SFTExamples(tokens, idx, T=, eot_id=)`
gives example i's ids (`example(i)`) and trained targets (`trained(i)`: the stored mask, else the span rule).
`SFTExampleDataset` (readers/sft.py) is it with torch rows and batches; `inspect` and `verify` read it directly.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from niels_gpt.errors import CacheError, ConfigError
from niels_gpt.meta import (
    check_files,
    check_sft_offsets,
    load_checked_npy,
    numpy_dtype,
    raise_on_problems,
    read_meta,
)
from niels_gpt.readers.checks import count
from niels_gpt.readers.mmap import open_tokens, window_view
from niels_gpt.resume import cache_fingerprint
from niels_gpt.spans import assistant_span_mask
from niels_gpt.storage.remote import open_location, split_url
from niels_gpt.urls import is_url


class SFTExamples:
    """One split of an SFT cache, checked on open: its examples' ids and trained targets as numpy."""

    def __init__(self, tokens_path: str, idx_path: str, *, T: int, eot_id: int):
        """`tokens_path`: `<cache>/<split>_tokens.bin`, `idx_path`: its int64 offsets (`<split>_idx.npy`)."""
        T = count("SFTExampleDataset", "T", T, what="a window length")
        self.remote = None
        (tok_dir, tok_name), (idx_dir, idx_name) = (split_url(p) if is_url(p) else os.path.split(os.path.abspath(p))
                                                    for p in (tokens_path, idx_path))
        split = tok_name.removesuffix("_tokens.bin")
        if tok_dir != idx_dir or idx_name != f"{split}_idx.npy":  # another split's offsets read the wrong examples
            want = f"{split}_idx.npy" if tok_name != split else "<split>_idx.npy with <split>_tokens.bin"
            raise ConfigError(f"{tokens_path} and {idx_path}: not the tokens and offsets of one split of one cache; "
                              f"pass the tokens file first, then {want} from its directory")
        if is_url(tokens_path):
            local, self.remote = open_location(tok_dir)
            tokens_path, idx_path = local / tok_name, local / idx_name
        self.tokens_path, self.idx_path = Path(tokens_path), Path(idx_path)
        self.T, self.eot_id = T, int(eot_id)
        self.cache_dir = self.tokens_path.parent
        self.meta = read_meta(str(self.cache_dir))
        if self.meta.get("kind") != "sft":
            raise CacheError(f"{self.cache_dir}: not an SFT cache (kind={self.meta.get('kind')!r})")
        specials = self.meta["special_token_ids"]
        if specials["eot"] != self.eot_id:
            raise ConfigError(f"eot_id={eot_id} but {self.cache_dir}/meta.json records eot={specials['eot']}: "
                              "pass the EOT id of the tokenizer that built this cache")
        self.dtype = numpy_dtype(self.meta["token_dtype"])
        mask_name = self.tokens_path.name.replace("_tokens.bin", "_mask.bin")
        self.mask_path = self.cache_dir / mask_name if mask_name in self.meta["files"] else None
        if specials.get("asst") is None and self.mask_path is None:
            raise CacheError(f"{self.cache_dir}/meta.json: no assistant sentinel (special_token_ids.asst is null) "
                             f"and no {mask_name} recorded, so no token can be trained; rebuild the cache")
        self.asst_id = None if specials.get("asst") is None else int(specials["asst"])
        names = {self.tokens_path.name, self.idx_path.name} | ({mask_name} if self.mask_path else set())
        problems = [p for p in check_files(self.cache_dir, self.meta) if Path(p.split(":")[0]).name in names]
        if self.remote is not None:  # fetched on first use; size and sha256 checked then
            self.remote.fetch(self.idx_path.name)
            problems = [p for p in problems if ": missing (meta lists" not in p]
        raise_on_problems(problems, self.cache_dir)
        rec = self.meta["files"].get(self.tokens_path.name)
        if self.remote is not None and rec is None:
            raise CacheError(f"{self.remote.url}/meta.json does not list {self.tokens_path.name}")
        size = rec["bytes"] if self.remote is not None else self.tokens_path.stat().st_size
        self.num_tokens = size // self.dtype.itemsize
        offsets = load_checked_npy(self.idx_path, self.meta["files"].get(self.idx_path.name), "offsets")
        self.offsets = check_sft_offsets(offsets, self.num_tokens, self.idx_path)
        if len(self.offsets) == 0:
            raise CacheError(f"{self.idx_path}: no examples in this split")
        self.ends = np.append(self.offsets[1:], self.num_tokens)
        if self.mask_path is not None:  # a remote mask is fetched on first use: its recorded size is checked now
            mask_bytes = (self.meta["files"][mask_name]["bytes"] if self.remote is not None
                          else self.mask_path.stat().st_size)
            if mask_bytes != self.num_tokens:
                raise CacheError(f"{self.mask_path}: {mask_bytes} bytes but {self.tokens_path.name} holds "
                                 f"{self.num_tokens} tokens (one mask byte each); rebuild the cache")
        self._mapped: dict[bool, tuple] = {}  # per process: _maps(mask) -> (file, its windows)

    def __len__(self) -> int:
        return len(self.offsets)

    def fingerprint(self) -> str:
        return cache_fingerprint(self, self.cache_dir, self.meta, self.T)

    def __getstate__(self):
        return {**self.__dict__, "_mapped": {}}

    def _maps(self, mask: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """(the token or mask file mapped; its windows of T+1, None if shorter), once per process."""
        if mask not in self._mapped:
            path, dtype = (self.mask_path, np.dtype(np.uint8)) if mask else (self.tokens_path, self.dtype)
            if self.remote is not None:
                self.remote.fetch(path.name)
            a = open_tokens(path, dtype, expected_bytes=self.num_tokens * dtype.itemsize)
            self._mapped[mask] = (a, window_view(a, self.T + 1) if len(a) > self.T else None)
        return self._mapped[mask]

    def example(self, i: int) -> np.ndarray:
        """The full token ids of example i (a view of the memory map)."""
        return self._maps()[0][self.offsets[i]:self.ends[i]]

    def trained(self, i: int) -> np.ndarray:
        """Bool per token of example i: whether it is a trained target (stored mask, else the span rule)."""
        if self.mask_path is None:
            return assistant_span_mask(np.asarray(self.example(i)), self.asst_id, self.eot_id)
        return self._maps(mask=True)[0][self.offsets[i]:self.ends[i]].astype(bool)
