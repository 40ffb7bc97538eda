"""An epoch's order of n samples as a function of the position: nothing of size n is ever held.

A keyed permutation of range(n): a balanced Feistel network over the smallest domain of 4**h >= n values
(ROUNDS 31-bit keys drawn by torch from mix_seed(seed, epoch)), with cycle-walking: a value >= n goes
through again until it lands in range(n). Worked example, n = 10: h = 2 (domain 16); position 3 goes to,
say, 12 (>= 10), then again to 7: order[3] = 7. Cost: ~4x a torch.randperm's time per sample, a chunk of
CHUNK positions at a time; up to SMALL_ORDER samples the order is a held int32 randperm instead.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

ROUNDS = 6
CHUNK = 1 << 16  # positions computed at once (512 KiB of int64)
MASK31 = (1 << 31) - 1
_M1, _M2 = 0x5BD1E995, 0x2C1B3C6D  # odd multipliers below 2**31 (murmur-style mixing)
SMALL_ORDER = 1 << 22  # samples up to which the order is a held randperm (int32: 16 MiB at most)


class Order:
    """An epoch's order of n samples: `order[positions] -> indices` (int64 tensors; a slice as a tensor gives
    it), `order.slice(start, stop)`, `len(order) == n`; a subclass sets `n` and computes `_at(positions)`."""

    _chunk: tuple[int, torch.Tensor] = (0, torch.empty(0, dtype=torch.int64))  # (first position, the chunk)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, positions) -> torch.Tensor:
        if isinstance(positions, slice):
            start, stop, step = positions.indices(self.n)
            if step == 1:
                return self.slice(start, max(start, stop))
            positions = torch.arange(start, stop, step, dtype=torch.int64)
        return self._at(torch.as_tensor(positions, dtype=torch.int64))

    def materialise(self) -> torch.Tensor:
        """The whole order, int64[n] (tests and small datasets; the samplers never call it)."""
        return self.slice(0, self.n)

    def slice(self, start: int, stop: int) -> torch.Tensor:
        """order[start:stop], from a chunk of CHUNK positions computed at once (one call on 65,536 positions
        costs what ~20 calls on 32 do, and batches are consecutive slices); a held order slices itself."""
        stop = min(stop, self.n)
        c0, chunk = self._chunk
        if not c0 <= start <= stop <= c0 + len(chunk):
            if stop - start > CHUNK:
                return self._at(torch.arange(start, stop, dtype=torch.int64))
            c0, chunk = start, self._at(torch.arange(start, min(start + CHUNK, self.n), dtype=torch.int64))
            self._chunk = (c0, chunk)
        return chunk[start - c0:stop - c0]


class EpochOrder(Order):
    """The keyed network's order (the module docstring), computed position by position."""

    def __init__(self, n: int, keys: torch.Tensor):
        self.n = int(n)
        half = max(1, ((max(self.n, 2) - 1).bit_length() + 1) // 2)
        self.half, self.mask = half, (1 << half) - 1
        self.keys = [int(k) for k in keys]

    @classmethod
    def seeded(cls, n: int, seed: int) -> EpochOrder:
        """The order keyed from torch.Generator(seed)."""
        g = torch.Generator()
        g.manual_seed(seed)
        return cls(n, torch.randint(0, MASK31 + 1, (ROUNDS,), generator=g, dtype=torch.int64))

    def _network(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            f = ((right ^ k) * _M1) & MASK31
            f = ((f ^ (f >> 15)) * _M2) & MASK31
            left, right = right, left ^ ((f ^ (f >> 13)) & self.mask)
        return (left << self.half) | right

    def _at(self, positions: torch.Tensor) -> torch.Tensor:
        # NOTE: numpy for the arithmetic: ~1 us a call against torch's ~5 us, and no intra-op threads
        x = self._network(positions.numpy())
        walking = np.flatnonzero(x >= self.n)
        while len(walking):  # only the values still outside range(n) go round again
            y = self._network(x[walking])
            x[walking] = y
            walking = walking[y >= self.n]
        return torch.from_numpy(x)


class TensorOrder(Order):
    """An order held as a tensor (int32 when n < 2**31: half of int64)."""

    def __init__(self, order: torch.Tensor):
        self.order = order.to(torch.int32) if len(order) < 2**31 else order
        self.n = len(order)

    def _at(self, positions: torch.Tensor) -> torch.Tensor:
        return self.order[positions].to(torch.int64)

    def slice(self, start: int, stop: int) -> torch.Tensor:
        return self.order[start:stop].to(torch.int64)


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers, so (seed, epoch) and (seed+1, epoch-1) give unrelated streams."""
    digest = hashlib.sha256(b"niels_gpt:" + b",".join(str(int(p)).encode() for p in parts)).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def epoch_order(n: int, seed: int, epoch: int) -> EpochOrder | TensorOrder:
    """The global order of epoch `epoch`: up to SMALL_ORDER samples a held torch.randperm, above it computed
    position by position."""
    if n <= SMALL_ORDER:
        g = torch.Generator()
        g.manual_seed(mix_seed(seed, epoch))
        return TensorOrder(torch.randperm(n, generator=g, dtype=torch.int32))
    return EpochOrder.seeded(n, mix_seed(seed, epoch))


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The global order of epoch `epoch`, whole: int64[n] (the samplers read it a slice at a time)."""
    return epoch_order(n, seed, epoch).materialise()


def global_batches(n: int, global_batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Every full global batch of an epoch, in order."""
    perm = epoch_permutation(n, seed, epoch)
    usable = n // global_batch_size * global_batch_size
    return perm[:usable].view(-1, global_batch_size).tolist() if usable else []
