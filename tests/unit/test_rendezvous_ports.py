"""Rendezvous ports: MASTER_ADDR is rank 0's node's address, MASTER_PORT a port of its range that no
live gang holds on that address, held until rank 0's node's GPUs of that attempt are released.

Why: two gangs whose rank 0 share a host must not collide on one port, and a gang spanning hosts
must rendezvous at its rank 0's node."""

from __future__ import annotations

import random

import msgspec
import pytest

from corral import core
from corral.contracts import events as ev
from corral.contracts.cluster import GpuDevice
from corral.contracts.envelope import Reason, job_stream, node_stream
from corral.contracts.registry import decode, encode
from corral.core.rendezvous import choose_port, parse_port_range
from corral.projection import ClusterView
from corral.services.placement.rendezvous import choose_rendezvous

#: three hosts on distinct loopback addresses, and a second fake node on the third host
NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3", "n3": "127.0.0.4", "n4": "127.0.0.4"}
RANGE = (29500, 29529)  # 30 ports: small, so that hashes collide and the scan is exercised


def registered(node: str, address: str | None, ports: tuple[int, int] | None = RANGE) -> ev.NodeRegistered:
    return ev.NodeRegistered.new(
        stream=node_stream(node), actor="agent", node=node, gpus=[GpuDevice(index=i, model="H100") for i in range(8)],
        nvlink_domains=[list(range(8))], rack="r", zone="z", address=address,
        rendezvous_ports=ev.PortRange(low=ports[0], high=ports[1]) if ports else None)


def cluster() -> ClusterView:
    view = ClusterView()
    for node, address in NODES.items():
        view.apply(registered(node, address))
    return view


def gang(job: str, nodes: list[str], attempt: int = 0) -> core.Placement:
    return core.Placement(tuple(core.RankPlacement(i, n, (i,)) for i, n in enumerate(nodes)))


def reserve(view: ClusterView, job: str, placement: core.Placement, taken: dict[str, set[int]],
            attempt: int = 0) -> ev.GangReserved:
    chosen = choose_rendezvous(view, job, attempt, placement, taken, "127.0.0.1")
    assert not isinstance(chosen, core.Reason), chosen
    address, port = chosen
    return ev.GangReserved.new(
        stream=job_stream(job), actor="placement", correlation_id=job, job_id=job, attempt=attempt,
        ranks=[ev.RankPlacement(rank=r.rank, node=r.node, gpus=list(r.gpus)) for r in placement.ranks],
        world_size=len(placement.ranks), master_addr=address, master_port=port)


def release(view: ClusterView, job: str, attempt: int = 0) -> None:
    j = view.jobs[job]
    view.apply(ev.GangReleased.new(stream=job_stream(job), actor="placement", correlation_id=job, job_id=job,
                                   attempt=attempt, reason=Reason(code="COMPLETED", message="done")))
    for node in sorted({r.node for r in j.ranks}):
        view.apply(ev.GpusReleased.new(stream=node_stream(node), actor="placement", correlation_id=job, job_id=job,
                                       node=node, attempt=attempt, gpus=[r.gpus[0] for r in j.ranks if r.node == node]))


def live_rendezvous(view: ClusterView) -> list[tuple[str, str, int]]:
    """(node of rank 0, MASTER_ADDR, MASTER_PORT) of every gang holding GPUs."""
    out = []
    for j in view.jobs.values():
        if j.holding:
            r = j.rendezvous[j.attempt]
            out.append((r.node, r.address, r.port))
    return out


def test_parse_port_range() -> None:
    assert parse_port_range("29500-30499") == (29500, 30499)
    assert parse_port_range(" 7-7 ") == (7, 7)
    for bad, words in (("29500", "LO-HI"), ("a-b", "LO-HI"), ("0-10", "1..65535"), ("10-70000", "1..65535"),
                       ("30-20", "below")):
        with pytest.raises(ValueError, match=words):
            parse_port_range(bad)


def test_choose_port_is_deterministic_skips_held_ports_and_wraps() -> None:
    first = choose_port("job:0", 100, 109, set())
    assert first is not None and 100 <= first <= 109
    assert choose_port("job:0", 100, 109, set()) == first
    assert choose_port("job:0", 100, 109, {first}) == (first + 1 if first < 109 else 100)
    assert choose_port("job:0", 100, 109, set(range(100, 110)) - {first - 1 if first > 100 else 109}) is not None
    assert choose_port("job:0", 100, 109, set(range(100, 110))) is None


def test_node_registered_refuses_a_bad_address_or_port_range() -> None:
    good = registered("n1", "10.0.0.7")
    assert decode(encode(good)) == good
    raw = msgspec.json.decode(encode(good))
    for field, value, words in (("address", "10.0.0.7; rm -rf /", "address"),
                                ("rendezvous_ports", {"low": 30000, "high": 29000}, "below"),
                                ("rendezvous_ports", {"low": 0, "high": 10}, "low")):
        with pytest.raises(Exception, match=words):
            decode(msgspec.json.encode({**raw, field: value}))
    old = {k: v for k, v in raw.items() if k not in ("address", "rendezvous_ports")}
    assert decode(msgspec.json.encode(old)).address is None  # an agent that sends no address or range


def test_a_registration_with_a_new_address_or_range_is_recorded_again() -> None:
    from corral.services.placement.service import _same_inventory

    view = cluster()
    known = view.nodes["n1"]
    assert _same_inventory(known, registered("n1", "127.0.0.2"))
    assert not _same_inventory(known, registered("n1", "127.0.0.9"))
    assert not _same_inventory(known, registered("n1", "127.0.0.2", (29500, 29999)))
    view.apply(registered("n1", "127.0.0.9", None))
    assert (view.nodes["n1"].address, view.nodes["n1"].rendezvous_ports) == ("127.0.0.9", None)


def test_master_is_rank_0s_node_address_and_a_node_without_one_gets_the_fallback() -> None:
    view = cluster()
    view.apply(registered("old", None, None))
    taken: dict[str, set[int]] = {}
    e = reserve(view, "j1", gang("j1", ["n2", "n1"]), taken)
    assert e.master_addr == "127.0.0.3" and RANGE[0] <= e.master_port <= RANGE[1]
    chosen = choose_rendezvous(view, "j2", 0, gang("j2", ["old", "n1"]), taken, "127.0.0.1")
    assert not isinstance(chosen, core.Reason) and chosen[0] == "127.0.0.1" and 29500 <= chosen[1] <= 49499


def test_fifty_concurrent_multi_node_jobs_never_share_a_port_of_one_node() -> None:
    """50 gangs of 2-3 nodes placed in cycles of 10 (ports of one cycle are not in the log yet),
    then churn: some end, more are placed. No two live gangs ever hold one (address, port), hence
    one (node, MASTER_PORT); a port comes back only once rank 0's node released its GPUs."""
    view = cluster()
    rng = random.Random(15)
    live: list[str] = []
    serial = 0

    def place(count: int) -> None:
        nonlocal serial
        taken: dict[str, set[int]] = {}
        for _ in range(count):
            job = f"job-{serial:03d}"
            serial += 1
            nodes = rng.sample(sorted(NODES), rng.choice((2, 3)))
            view.apply(reserve(view, job, gang(job, nodes), taken))
            live.append(job)

    def check() -> None:
        rdv = live_rendezvous(view)
        assert len(rdv) == len(live)
        by_address = [(a, p) for _, a, p in rdv]
        assert len(set(by_address)) == len(by_address), "two live gangs hold one port of one address"
        by_node = [(n, p) for n, _, p in rdv]
        assert len(set(by_node)) == len(by_node), "two live gangs hold one port of one node"
        assert all(NODES[n] == a and RANGE[0] <= p <= RANGE[1] for n, a, p in rdv)
        held = {(a, p) for a, ports in view.ports.items() for p in ports}
        assert held == set(by_address), "the projection holds exactly the live gangs' ports"

    for _ in range(5):
        place(10)
        check()
    assert len(live) == 50
    for _ in range(3):
        for job in rng.sample(live, 15):
            release(view, job)
            live.remove(job)
        check()
        place(15)
        check()


def test_a_port_is_held_until_rank_0s_node_releases_its_gpus() -> None:
    view = cluster()
    e = reserve(view, "j1", gang("j1", ["n1", "n2"]), {})
    view.apply(e)
    view.apply(ev.GangReleased.new(stream=job_stream("j1"), actor="placement", correlation_id="j1", job_id="j1",
                                   attempt=0, reason=Reason(code="PREEMPTED", message="for j9")))
    assert view.ports == {"127.0.0.2": {e.master_port: ("j1", 0)}}, "rank 0 may still run: the fence"
    view.apply(ev.GpusReleased.new(stream=node_stream("n2"), actor="placement", correlation_id="j1", job_id="j1",
                                   node="n2", attempt=0, gpus=[1]))
    assert view.ports, "another node's release does not free rank 0's port"
    view.apply(ev.GpusReleased.new(stream=node_stream("n1"), actor="placement", correlation_id="j1", job_id="j1",
                                   node="n1", attempt=0, gpus=[0]))
    assert view.ports == {} and view.jobs["j1"].rendezvous == {}


def test_a_node_whose_every_port_is_held_leaves_the_job_pending_with_a_reason() -> None:
    view = ClusterView()
    view.apply(registered("tiny", "127.0.0.2", (40000, 40001)))
    view.apply(registered("n2", "127.0.0.3", (40000, 40001)))
    taken: dict[str, set[int]] = {}
    for job in ("a", "b"):
        view.apply(reserve(view, job, gang(job, ["tiny", "n2"]), taken))
    reason = choose_rendezvous(view, "c", 0, gang("c", ["tiny", "n2"]), {}, "127.0.0.1")
    assert isinstance(reason, core.Reason) and reason.code is core.ReasonCode.RENDEZVOUS_PORTS_EXHAUSTED
    assert "40000-40001" in reason.message and "tiny" in reason.message and "--port-range" in reason.message
    other = choose_rendezvous(view, "c", 0, gang("c", ["n2", "tiny"]), {}, "127.0.0.1")
    assert other == ("127.0.0.3", other[1]) if not isinstance(other, core.Reason) else False
    release(view, "a")
    assert choose_rendezvous(view, "c", 0, gang("c", ["tiny", "n2"]), {}, "127.0.0.1") in (
        ("127.0.0.2", 40000), ("127.0.0.2", 40001))
