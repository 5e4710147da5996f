"""The newest events a process followed the whole log through, kept so that another reader of the
same positions in the process takes them from memory (`EventStore.read_all`).

Why: the outbox relay and the read model's projector follow the same log, mostly in the same
process (both leases go to the process that waits least, `services/relay.py`): the relay reads
each event at the head, and the projector would read it again from Postgres a fraction of a
second later, every row sent and decoded twice. Positions are handed out gapless and in commit
order, and an event never changes (`corral.eventstore.store`), so a run of consecutive positions
read once is the log there for good; a read that finds another event at a kept position (a log
restored from a backup) replaces the run.
"""

from __future__ import annotations

from corral.eventstore.records import StoredEvent

#: Events kept: about a second of the log at its busiest (a projector polls a few times a second).
KEPT = 8192


class RecentEvents:
    """One run of consecutive positions of the log, the newest read, at most `kept` events."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._events: list[StoredEvent] = []

    def remember(self, events: list[StoredEvent]) -> None:
        """Keep `events` (a read of the whole log, in position order): they extend the run when
        they continue or overlap it, replace it when they are newer or disagree with it, and are
        left out when they are older (the run stays the newest)."""
        if not events:
            return
        first = events[0].position
        if events[-1].position - first != len(events) - 1:
            return  # not consecutive: not a read of the whole log
        run = self._events
        if run and run[0].position <= first <= run[-1].position + 1:
            offset = first - run[0].position
            if offset < len(run) and run[offset].event_id != events[0].event_id:
                self._events = run = list(events)  # another log at these positions
            else:
                del run[offset:]
                run.extend(events)
        elif run and events[-1].position < run[0].position:
            return
        else:
            self._events = run = list(events)
        if len(run) > self._kept:
            del run[:len(run) - self._kept]

    def after(self, position: int, limit: int) -> list[StoredEvent]:
        """The kept events right after `position`, at most `limit` (none when the run does not
        hold position + 1)."""
        run = self._events
        if not run:
            return []
        start = position + 1 - run[0].position
        if start < 0 or start >= len(run):
            return []
        return run[start:start + limit]
