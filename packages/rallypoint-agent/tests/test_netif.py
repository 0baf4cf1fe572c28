"""Finding the interface of the agent's address, and the socket-interface variables for workers."""

from __future__ import annotations

import pytest

from rallypoint.agent.netif import socket_ifname_env
from rallypoint.rendezvous.netif import interface_addresses, interface_for_address


def _non_loopback() -> tuple[str, str] | None:
    for name, addresses in interface_addresses().items():
        for addr in addresses:
            if name != "lo" and ":" not in addr:
                return name, addr
    return None


def test_loopback_addresses_are_found_on_lo() -> None:
    assert interface_for_address("127.0.0.1") == "lo"
    assert interface_for_address("localhost") == "lo"


def test_an_address_no_interface_holds_is_none() -> None:
    assert interface_for_address("203.0.113.77") is None  # TEST-NET-3, never assigned here
    assert interface_for_address("no-such-host.invalid") is None
    assert socket_ifname_env(interface_for_address("203.0.113.77"), {}) == {}


def test_loopback_gets_no_variables() -> None:
    # on one host the libraries' own choice is right; forcing lo would break nothing but says nothing
    assert socket_ifname_env(interface_for_address("127.0.0.1"), {}) == {}
    assert socket_ifname_env(None, {}) == {}


def test_the_interface_of_a_real_address_is_named_for_gloo_and_nccl() -> None:
    found = _non_loopback()
    if found is None:
        pytest.fail(f"this machine has no non-loopback IPv4 address: {interface_addresses()}")
    name, addr = found
    assert interface_for_address(addr) == name
    expected = {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
    assert socket_ifname_env(interface_for_address(addr), {}) == expected


def test_a_variable_the_user_set_is_never_replaced() -> None:
    found = _non_loopback()
    assert found is not None
    _, addr = found
    name = interface_for_address(addr)
    assert socket_ifname_env(name, {"GLOO_SOCKET_IFNAME": "ib0"}) == {"NCCL_SOCKET_IFNAME": found[0]}
    assert socket_ifname_env(name, {"GLOO_SOCKET_IFNAME": "x", "NCCL_SOCKET_IFNAME": "y"}) == {}
