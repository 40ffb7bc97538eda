"""Readers of the library's own caches: random pretraining windows (`pretrain`) over one window core
(`windows_core`), assistant-masked SFT rows (`sft`), a split's shard listing (`shards`) and the memory maps
they share (`mmap`). `niels_gpt.cache` re-exports them under the contract's names."""
