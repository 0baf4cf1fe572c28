"""File-backed rendezvous backend for rallypoint (fcntl locks on a shared file system)."""
