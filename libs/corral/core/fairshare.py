"""Each queue's fair share of GPUs: what it would hold if the cluster were split by the queue tree's
rules among the queues that want GPUs right now.

Why: an operator looking at a queue's usage has its guarantee to compare it with, but a
guarantee alone does not say whether a queue holding 40 GPUs of a 16 guarantee takes more than its
due (nobody else wants them) or starves others; nor whether a queue at 10 of 16 is short (it wants
more) or simply idle. The fair share answers both, as Kueue's and Slurm's fair-share figures do.

The rule, at every level of the tree, for a parent's share (the cluster's usable GPUs at the top):
each child first gets its demand up to its guarantee (if the guarantees asked for exceed the
parent's share, that share is split by weight among them instead); what is left is split by weight
among the children that want more, water-filling: never above a child's demand or its `max_gpus`.
A queue's demand is what its subtree holds plus what its waiting jobs ask for. Shares are floats
(a share of 2.5 GPUs is a fair figure even if a GPU is whole); the shares of a parent's children
never add up to more than the parent's share, and to all of it while they want as much.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.quota import ROOT, QueueTree

_EPSILON = 1e-9


def subtree_demand(tree: QueueTree, demand: Mapping[str, int]) -> dict[str, float]:
    """Each queue's demand: its own plus its descendants', capped by its `max_gpus`."""
    out: dict[str, float] = {}
    for name in sorted(tree.guarantee, key=lambda n: -n.count("/") if n else 1):
        if name == ROOT:
            continue
        total = float(demand.get(name, 0)) + sum(out.get(c, 0.0) for c in tree.children.get(name, ()))
        ceiling = tree.max_gpus(name)
        out[name] = min(total, float(ceiling)) if ceiling is not None else total
    return out


def water_fill(amount: float, caps: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Split `amount` by weight, each taker never above its cap; what a capped taker leaves goes
    to the others, by weight again."""
    given = {name: 0.0 for name in caps}
    open_ = {name for name, cap in caps.items() if cap > _EPSILON}
    left = amount
    while left > _EPSILON and open_:
        total_weight = sum(max(weights.get(n, 1.0), _EPSILON) for n in open_)
        level = left / total_weight
        full = {n for n in open_ if caps[n] - given[n] <= level * max(weights.get(n, 1.0), _EPSILON) + _EPSILON}
        if not full:
            for n in open_:
                given[n] += level * max(weights.get(n, 1.0), _EPSILON)
            break
        for n in full:
            left -= caps[n] - given[n]
            given[n] = caps[n]
        open_ -= full
    return given


def _split(share: float, children: list[str], tree: QueueTree, wanted: Mapping[str, float]) -> dict[str, float]:
    """One parent's share among its children: guarantees (up to demand) first, then by weight."""
    weights = {c: tree.weight(c) for c in children}
    first = {c: min(wanted.get(c, 0.0), float(tree.guarantee.get(c, 0))) for c in children}
    if sum(first.values()) >= share:
        return water_fill(share, first, weights)
    rest = water_fill(share - sum(first.values()), {c: wanted.get(c, 0.0) - first[c] for c in children}, weights)
    return {c: first[c] + rest[c] for c in children}


def fair_shares(tree: QueueTree, demand: Mapping[str, int]) -> dict[str, float]:
    """Every queue's fair share of GPUs (implicit ancestors included), given each queue's own
    demand in GPUs (held plus waiting; usually keyed by leaf queue)."""
    wanted = subtree_demand(tree, demand)
    shares: dict[str, float] = {ROOT: float(tree.capacity)}
    todo = [ROOT]
    while todo:
        parent = todo.pop()
        children = sorted(tree.children.get(parent, ()))
        if not children:
            continue
        shares.update(_split(shares[parent], children, tree, wanted))
        todo.extend(children)
    del shares[ROOT]
    return shares
