"""Gloo collective backend for rallypoint (CPU tensors; the default when no GPU is usable)."""
