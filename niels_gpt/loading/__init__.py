"""Training-time loading: global sampler, shard-window sampler, DDP/worker partitioning, exact resumption,
mixtures, random-window streams, prefetching from a cache URL, the streaming Parquet path and bits-per-byte.

    sampler = GlobalBatchSampler(ds, global_batch_size=64, seed=0)     # rank/world from torch.distributed
    loader = ResumableDataLoader(ds, sampler, num_workers=2)
    state = loader.state_dict(); loader.load_state_dict(state)          # JSON-able, any world size

Heavy modules (pyarrow) are imported only when the Parquet path is used.
"""

from niels_gpt.loading.bpb import evaluate_bpb, token_bytes
from niels_gpt.loading.mixture import MixtureConfig, MixtureDataset, MixtureSampler, Phase
from niels_gpt.loading.parquet import ParquetTokenLoader, list_parquet_files, split_files
from niels_gpt.loading.sampler import (
    GlobalBatchSampler,
    ResumableDataLoader,
    epoch_order,
    epoch_permutation,
    global_batches,
)
from niels_gpt.loading.schedule import BatchSchedule, batch_ramp
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.loading.stream import RankBatchStream
from niels_gpt.loading.windows import IndexedWindowDataset

__all__ = [
    "BatchSchedule", "GlobalBatchSampler", "IndexedWindowDataset", "MixtureConfig", "MixtureDataset", "MixtureSampler",
    "ParquetTokenLoader", "Phase", "RankBatchStream", "ResumableDataLoader", "ShardWindowSampler", "epoch_order",
    "batch_ramp", "epoch_permutation",
    "evaluate_bpb", "global_batches", "list_parquet_files", "split_files", "token_bytes",
]
