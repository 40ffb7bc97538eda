"""Resume states: this path re-exports `niels_gpt.resume`, where the one protocol lives."""

from niels_gpt.resume import *  # noqa: F403
from niels_gpt.resume import (  # noqa: F401
    STATE_VERSION,
    check_state,
    dataset_fingerprint,
    dist_info,
    fingerprint,
    resolve_rank,
)
