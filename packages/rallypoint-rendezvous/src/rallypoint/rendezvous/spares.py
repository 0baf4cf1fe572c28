"""Nodes that wait for a round: they grow the job, or stand by as hot spares.

A node that arrives while round ``r`` is complete writes its join record for round ``r + 1`` and
counts itself in that round's join counter (the wait list, :mod:`rallypoint.rendezvous.state`).
What the running members make of it is decided here, once:

* the round has fewer members than ``nodes.max``: the waiting node can grow the job, so
  :func:`nodes_waiting` says so and every agent stops its workers and re-rendezvouses (no restart
  counted);
* the round is full: the waiting node is a **hot spare**. The members go on undisturbed (0
  waiting); the spare's agent stays joined, heartbeating, with its interpreter and plugins loaded.
  When a member dies or fails, the next round takes the survivors and the spare, so the job keeps
  its size; the rank strategy decides where the spare's ranks go (``previous_rank`` keeps the
  survivors' ranks where it can).

The agent reads this through :meth:`rallypoint.rendezvous.handler.RendezvousHandler.num_nodes_waiting`
at each monitor interval (:mod:`rallypoint.agent.attempt`). User docs: the "Hot spares" section of
docs/agent.md; tests: ``integration-tests/test_spares.py``.
"""

from __future__ import annotations

from rallypoint.rendezvous.keyspace import Header

__all__ = ["nodes_waiting"]


def nodes_waiting(last_round: int, header: Header, count_next: int, max_nodes: int) -> int:
    """How many nodes wait for a new round, as seen by a member of ``last_round``.

    Args:
        last_round: the round this node completed.
        header: the current header.
        count_next: the join counter of round ``header.round + 1`` when ``header.round ==
            last_round``, else of ``header.round``.
        max_nodes: the job's maximum.

    Returns:
        0 while the round runs and nobody waits (or the round is full, so waiting nodes are
        spares); otherwise at least 1: the agent should stop its workers and re-rendezvous.
    """
    if header.closed:
        return 0
    if header.round > last_round:
        return max(1, count_next)
    if header.complete and header.num_members < max_nodes:
        return max(0, count_next)
    return 0
