"""niels_gpt data layer: reproducible token caches and memory-speed PyTorch loading.

Build: text and chat sources -> tokenizer -> streaming writers -> token cache on disk.
Serve: token cache -> memory-mapped readers -> datasets -> samplers and loaders -> training step.
"""

__version__ = "0.6.0"
