"""The NATS message id of a submission with a `submission_id`: scoped to its user.

JetStream drops a message whose `Nats-Msg-Id` it has seen within its duplicate window, across the
whole inbox stream whatever the subject; the owning service's tracking row is keyed by the same
id. A msg id made of the submission id alone let alice's id drop bob's submission as a copy of
hers. This one is a digest of (user, submission id), keyed by a secret of the publisher's, so it
is the same for one user's retries, another user's never, and no one can publish ahead under the
msg id of another's future submission; any header-safe text, whatever the id holds. Pure.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["submission_msg_id"]


def submission_msg_id(user: str, submission_id: str, key: bytes = b"") -> str:
    """The Nats-Msg-Id of `user`'s submission `submission_id`, keyed by `key`."""
    digest = hmac.new(key, f"{user}\0{submission_id}".encode(), hashlib.sha256).hexdigest()
    return f"sub-{digest[:40]}"
