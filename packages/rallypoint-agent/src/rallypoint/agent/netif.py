"""The socket-interface variables of workers: so they use the network the agent was given.

Gloo and NCCL's socket bootstrap pick an interface by resolving the host name; on hosts whose
name resolves to 127.0.0.1 (many cloud images) they bind loopback and a job across hosts cannot
connect. The agent's workers get ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` naming the
interface of the agent's address (``--local-addr``, or the one the agent found:
:func:`rallypoint.rendezvous.netif.routable_address`), unless the user set them.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SOCKET_IFNAME_VARIABLES", "socket_ifname_env"]

#: The variables that name the interface collective libraries bind; a user's value always wins.
SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def socket_ifname_env(interface: str | None, user_env: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` for the workers of an agent on ``interface``.

    Args:
        interface: the interface holding the agent's address
            (:func:`rallypoint.rendezvous.netif.interface_for_address`), or ``None``.
        user_env: variables the user set (the agent's environment and the job's ``[job] env``).

    Returns:
        Nothing for a variable the user already set, for loopback (on one host the libraries'
        own choice is right), or without an interface; else both variables naming it.

    Example:
        >>> socket_ifname_env("eth0", {"NCCL_SOCKET_IFNAME": "ib0"})
        {'GLOO_SOCKET_IFNAME': 'eth0'}
    """
    if interface is None or interface == "lo":
        return {}
    return {var: interface for var in SOCKET_IFNAME_VARIABLES if var not in user_env}
