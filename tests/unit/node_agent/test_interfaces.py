"""Gloo's interface is the one holding the node's advertised address (`node_agent.host.interfaces`):
a host name resolving to loopback otherwise makes gloo offer its peers on other hosts 127.x."""

from __future__ import annotations

from corral.services.node_agent.host.interfaces import (
    GLOO_IFNAME,
    interface_holding,
    local_addresses,
    with_gloo_interface,
)

HOST = [("lo", "127.0.0.1"), ("lo", "::1"), ("eth0", "10.77.0.2"), ("eth1", "192.168.5.7"), ("eth1", "fd00::7")]


def test_the_interface_holding_the_address_is_chosen() -> None:
    assert interface_holding(["10.77.0.2"], HOST) == "eth0"
    assert interface_holding(["192.168.5.7"], HOST) == "eth1"
    assert interface_holding(["fd00::7"], HOST) == "eth1"
    assert interface_holding(["203.0.113.9", "192.168.5.7"], HOST) == "eth1", "any address of a resolved name"


def test_a_loopback_alias_is_the_loopback_interfaces_and_an_address_not_held_here_is_nobodys() -> None:
    assert interface_holding(["127.0.0.3"], HOST) == "lo"
    assert interface_holding(["203.0.113.9"], HOST) is None, "a NAT's or a proxy's address: gloo keeps its default"
    assert interface_holding([], HOST) is None


def test_this_hosts_addresses_include_loopback() -> None:
    assert ("lo", "127.0.0.1") in local_addresses()


def test_the_agents_environment_gets_the_interface_unless_it_names_one() -> None:
    env, chosen = with_gloo_interface({"PATH": "/bin"}, "127.0.0.1")
    assert chosen == "lo" and env == {"PATH": "/bin", GLOO_IFNAME: "lo"}
    kept, chosen = with_gloo_interface({GLOO_IFNAME: "ib0"}, "127.0.0.1")
    assert chosen is None and kept == {GLOO_IFNAME: "ib0"}, "the operator's choice is kept"
    assert with_gloo_interface({}, None) == ({}, None), "no advertised address (corral up's nodes): nothing set"
    assert with_gloo_interface({}, "no-such-host.invalid") == ({}, None)
