"""NCCL collective backend for rallypoint (CUDA tensors)."""
