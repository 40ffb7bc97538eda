"""Seeds: the one range every seed of the package must fall in, checked where a seed comes in.

Every random choice is drawn from a `torch.Generator` seeded with it, and sentencepiece's trainer takes the
same seed, so a seed must fit both: 0 <= seed <= 2**63 - 1. Outside it torch raises a bare RuntimeError and
sentencepiece a TypeError from deep inside a build; here it is one line naming the flag.
"""

from __future__ import annotations

import argparse

import numpy as np

from niels_gpt.errors import ConfigError

SEED_MAX = 2**63 - 1


def check_seed(seed, what: str = "seed") -> int:
    """`seed` as an int, or a ConfigError naming `what` and the accepted range."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"{what} {seed!r}: must be an integer from 0 to 2**63 - 1 ({SEED_MAX}), the range torch "
                          "generators and the tokenizer trainer accept; pick another seed")
    return int(seed)


def seed_arg(text: str) -> int:
    """argparse type of every --seed flag."""
    try:
        return check_seed(int(text), "--seed")
    except (ValueError, ConfigError) as exc:
        msg = str(exc) if isinstance(exc, ConfigError) else f"--seed {text!r}: not an integer"
        raise argparse.ArgumentTypeError(msg) from None


class UniformDraws:
    """`torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)` on the CPU, block
    after block, without torch (~1 s to import): its generator is MT19937 seeded with the seed's low 32 bits,
    a float64 the low 53 bits of two outputs (high word first) times 2**-53. tests/test_seeds.py holds it
    equal to torch's."""

    def __init__(self, seed: int):
        self._bits = np.random.MT19937()
        self._bits.state = np.random.RandomState(check_seed(seed) & 0xFFFFFFFF).get_state(legacy=False)

    def block(self, n: int) -> list[float]:
        words = self._bits.random_raw(2 * n)
        high_low = (words[0::2] << np.uint64(32)) | words[1::2]
        return ((high_low & np.uint64((1 << 53) - 1)).astype(np.float64) * 2.0**-53).tolist()
