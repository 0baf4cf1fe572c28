"""Side-by-side benchmarks of rallypoint against torch; see README.md and harness.py."""
