"""A class's shared RESERVED_FOR answer is reworded per job only when it is the backfill
reservation's: the guarantee hold is RESERVED_FOR too, and a class shares it as it is, whether or
not the cycle holds a reservation."""

from __future__ import annotations

import random

from corral.core import reasons
from corral.core.backfill import Reservation

from .test_core_properties import random_job


def test_only_the_backfill_reservations_reason_names_the_reservation() -> None:
    rng = random.Random(7)
    job, holder, starving = (random_job(rng, i, 0.0, ["a", "b"], False) for i in range(3))
    held = Reservation(holder.id, 120.0, ((0, 0b11),), 2, True)
    assert reasons.names_the_reservation(reasons.reserved_for(job, held, 0.0))
    hold = reasons.held_for_guarantee(job, 9, starving, 11)
    assert hold.code is reasons.ReasonCode.RESERVED_FOR and not reasons.names_the_reservation(hold)
