"""Seeds: the one range every seed of the package must fall in, checked where a seed comes in.

Every random choice is drawn from a `torch.Generator` seeded with it (the builders and pack-sft make torch's
draws without torch: `TorchDraws`), and sentencepiece's trainer takes the same seed, so a seed must fit both:
0 <= seed <= 2**63 - 1. Outside it torch raises a bare RuntimeError and sentencepiece a TypeError from deep
inside a build; here it is one line naming the flag.
"""

from __future__ import annotations

import argparse
import numbers

import numpy as np

from niels_gpt.errors import ConfigError

SEED_MAX = 2**63 - 1
TORCH_PERMUTATION = 1 << 21  # from here torch.randperm itself: its C loop and the import beat a Python loop


def check_seed(seed, what: str = "seed") -> int:
    """`seed` as an int (a numpy integer too; not a bool, nor a float), or a ConfigError naming `what`."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"{what} {seed!r}: must be an integer from 0 to 2**63 - 1 ({SEED_MAX}), the range torch "
                          "generators and the tokenizer trainer accept; pick another seed")
    return int(seed)


def seed_arg(text: str) -> int:
    """argparse type of every --seed flag."""
    try:
        return check_seed(int(text), "--seed")
    except ValueError as exc:  # ConfigError is one too
        msg = str(exc) if isinstance(exc, ConfigError) else f"--seed {text!r}: not an integer"
        raise argparse.ArgumentTypeError(msg) from None


class TorchDraws:
    """The CPU draws of `torch.Generator().manual_seed(seed)`, call after call, without torch (~1 s to import):
    its generator is MT19937 seeded with the seed's low 32 bits, and
    - `uniform(n)` is torch.rand(n, dtype=torch.float64): the low 53 bits of two outputs (high first) * 2**-53;
    - `below(high, n)` is torch.randint(high, (n,)): an output modulo `high` below 2**28, else two (high first);
    - `permutation(n)` is torch.randperm(n): for i from 0 to n - 2, i swaps with i + (an output modulo (n - i));
      from TORCH_PERMUTATION elements torch's own call, on a generator advanced past the outputs drawn here
      (and from 2**32 // 20 elements torch draws otherwise).
    tests/test_seeds.py holds each equal to torch's."""

    def __init__(self, seed: int):
        self.seed = seed if type(seed) is int and 0 <= seed < 1 << 64 else check_seed(seed)  # torch's 2**63 + 1 too
        self._bits = np.random.MT19937()
        self._bits.state = np.random.RandomState(self.seed & 0xFFFFFFFF).get_state(legacy=False)
        self.words = 0  # 32-bit outputs drawn so far

    def _words(self, n: int) -> np.ndarray:
        self.words += n
        return self._bits.random_raw(n)

    def _wide(self, n: int) -> np.ndarray:
        words = self._words(2 * n)
        return (words[0::2] << np.uint64(32)) | words[1::2]

    def uniform(self, n: int) -> list[float]:
        return ((self._wide(n) & np.uint64((1 << 53) - 1)).astype(np.float64) * 2.0**-53).tolist()

    def below(self, high: int, n: int) -> list[int]:
        return ((self._words(n) if high < 1 << 28 else self._wide(n)) % np.uint64(high)).tolist()

    def permutation(self, n: int) -> list[int]:
        if n >= TORCH_PERMUTATION:
            import torch  # NOTE: here: a Python loop over 2 M elements costs more than importing torch (~0.7 s)

            gen = torch.Generator().manual_seed(self.seed)
            for done in range(0, self.words, 1 << 24):  # one output each, past what was drawn here, 128 MiB a call
                torch.randint(2, (min(1 << 24, self.words - done),), generator=gen)
            drawn = n - 1 if n < (1 << 32) // 20 else 2 * n  # what randperm draws: these draws follow it
            for done in range(0, drawn, 1 << 24):
                self._words(min(1 << 24, drawn - done))
            return torch.randperm(n, generator=gen).tolist()
        perm = list(range(n))
        for i, z in enumerate((self._words(max(n - 1, 0)) % np.arange(n, 1, -1, dtype=np.uint64)).tolist()):
            perm[i], perm[i + z] = perm[i + z], perm[i]
        return perm
