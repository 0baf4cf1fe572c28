"""Rank-assignment strategies for rallypoint: topology, explicit, env."""
