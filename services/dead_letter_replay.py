"""Replaying dead letters on an admin's request: a service republishes, the admin only asks.

Why a service: republishing a dead letter to its original subject from the CLI would need the
admin's NATS identity to publish every inbox subject (any user's, any node's), and with that the
admin could submit as bob or report alice's job as exited. So an admin asks on
`<ns>.admin.<admin>.dlq-replay` (core NATS request/reply; only an admin identity may publish its
own) and a service republishes. Only dead letters of the inbox stream are replayed:
only services publish those (`<ns>.dlq.<NS>_INBOX.<seq>`; a node agent may write dead letters of
the events stream only), so what is republished is what a client once sent, unchanged, with its
original subject (its sender) and message id. An event's dead letter is not republished: the
event is in the log (which the relay publishes), and only the relay publishes events.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from nats.aio.msg import Msg

from corral.bus import Bus
from corral.bus.dead_letters import DeadLetter, Replayed, get_dead_letter, list_dead_letters, replay
from corral.bus.naming import DLQ, INBOX
from corral.contracts.subjects import Subjects

log = logging.getLogger("corral.dlq")

#: One replay request answers at most this many dead letters (`--all` over a full DLQ).
REPLAY_LIMIT = 10_000


def replay_refused(bus: Bus, letter: DeadLetter) -> str | None:
    """Why `letter` is not replayed; None when it may be (a dead letter of the inbox stream, back
    onto an inbox subject)."""
    inbox = bus.names.stream(INBOX)
    if not letter.dlq_subject.startswith(f"{bus.names.name}.{DLQ}.{inbox}."):
        return (f"a dead letter of {letter.origin_stream or 'another stream'}, not of {inbox}: only requests "
                "are replayed (an event is in the log; its consumer reads it from there)")
    if not letter.subject.startswith(f"{bus.names.name}.{INBOX}."):
        return f"its original subject {letter.subject!r} is not an inbox subject"
    return None


async def answer(bus: Bus, admin: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Replay what `request` names (`{"seq": N}` or `{"all": true}`) for `admin`; one row each."""
    if request.get("all") is True:
        letters = await list_dead_letters(bus, limit=REPLAY_LIMIT)
    else:
        seq = request.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            return [{"seq": seq, "subject": None, "replayed": False,
                     "message": "give a dead letter's SEQ (a positive integer) or all"}]
        letter = await get_dead_letter(bus, seq)
        if letter is None:
            return [{"seq": seq, "subject": None, "replayed": False,
                     "message": f"no dead letter {seq}; see `corral dlq list`"}]
        letters = [letter]
    rows = []
    for letter in letters:
        refused = replay_refused(bus, letter)
        result = Replayed(letter.seq, letter.subject, False, refused) if refused else await replay(bus, letter)
        log.info("dead letter %d (%s) on %s's request: %s", letter.seq, letter.subject, admin,
                 "replayed" if result.replayed else f"not replayed: {result.message}")
        rows.append({"seq": result.seq, "subject": result.subject, "replayed": result.replayed,
                     "message": result.message})
    return rows


async def serve_replays(bus: Bus) -> None:
    """Answer admins' replay requests (one service process of the queue group answers each)."""
    subjects = Subjects(bus.names.name)

    async def on_request(msg: Msg) -> None:
        admin = msg.subject.split(".")[-2]
        try:
            request = json.loads(msg.data or b"{}")
            rows = await answer(bus, admin, request if isinstance(request, dict) else {})
        except Exception as exc:  # answered, never raised into the subscription
            log.exception("dead letter replay for %s failed", admin)
            rows = [{"seq": None, "subject": None, "replayed": False, "message": f"{type(exc).__name__}: {exc}"}]
        if msg.reply:
            await msg.respond(json.dumps(rows).encode())

    await bus.nc.subscribe(subjects.dead_letter_replay_wildcard, queue="corral-dlq-replay", cb=on_request)
