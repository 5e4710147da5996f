"""`fits_now` answers exactly what `find_placement` would, for any free GPUs and any job.

Why: backfill reservations and victim searches ask only "does the gang fit?" for each what-if
they try, and for jobs without a hard gang level `fits_now` answers from the free counts and the
cluster's rank capacity alone, without searching a placement; a wrong answer would move a
reservation or a preemption. Random clusters (racks, zones, NVLink domains, GPU models, draining
and lost nodes), random free GPUs and random job shapes compare the two; `fits_with` (the same,
as if more GPUs were free, without touching the index) is compared with `fits_now` on an index
where they are, and `Headroom` (those counts kept as GPUs are added, mask by mask, the same node
again and again) likewise after every mask.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from corral.core import Placement
from corral.core.fitcount import Headroom, fits_with
from corral.core.gpuset import FreeGpus
from corral.core.placement import find_placement, fits_now

from .test_core_properties import SETTINGS, clusters, random_job


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_fits_now_is_find_placement_returning_a_placement(data, seed) -> None:
    cluster = data.draw(clusters())
    rng = random.Random(seed)
    for _ in range(20):
        free = {
            n.name: [g.index for g in n.gpus if rng.random() < rng.choice([0.2, 0.6, 1.0])] for n in cluster.nodes
        }
        fi = FreeGpus.from_mapping(cluster, free)
        for n in range(5):
            job = random_job(rng, n, 0.0, ["q"], simple=rng.random() < 0.3)
            assert fits_now(fi, job) == isinstance(find_placement(cluster, fi, job), Placement), (job, free)


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_fits_with_is_fits_now_once_the_gained_gpus_are_free(data, seed) -> None:
    cluster = data.draw(clusters())
    rng = random.Random(seed)
    for _ in range(10):
        free = {n.name: [g.index for g in n.gpus if rng.random() < 0.4] for n in cluster.nodes}
        fi = FreeGpus.from_mapping(cluster, free)
        gained = {i: rng.getrandbits(8) for i in range(len(cluster.nodes)) if rng.random() < 0.5}
        freed = FreeGpus.from_mapping(
            cluster,
            {
                n.name: [g.index for g in n.gpus if g.index in free[n.name] or gained.get(i, 0) >> g.index & 1]
                for i, n in enumerate(cluster.nodes)
            },
        )
        for n in range(5):
            job = random_job(rng, n, 0.0, ["q"], simple=rng.random() < 0.3)
            answer = fits_with(fi, job, gained)
            assert answer is None if job.topology.gang is not None else answer == fits_now(freed, job), (job, free)


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_headroom_follows_gpus_added_one_mask_at_a_time(data, seed) -> None:
    cluster = data.draw(clusters())
    rng = random.Random(seed)
    free = {n.name: [g.index for g in n.gpus if rng.random() < 0.3] for n in cluster.nodes}
    fi = FreeGpus.from_mapping(cluster, free)
    jobs = [j for j in (random_job(rng, n, 0.0, ["q"], simple=rng.random() < 0.3) for n in range(8))
            if j.topology.gang is None]
    rooms = [Headroom(fi, j) for j in jobs]
    added = {n.name: set(free[n.name]) for n in cluster.nodes}
    for _ in range(12):  # the same node may come back: masks accumulate
        i = rng.randrange(len(cluster.nodes))
        mask = rng.getrandbits(8)
        for room in rooms:
            room.add(i, mask)
        node = cluster.nodes[i]
        added[node.name] |= {g.index for g in node.gpus if mask >> g.index & 1}
        freed = FreeGpus.from_mapping(cluster, {name: sorted(gs) for name, gs in added.items()})
        for job, room in zip(jobs, rooms, strict=True):
            assert room.fits() == fits_now(freed, job), (job, added)
