"""The nats-servers a client may connect to, from one setting.

Why: a JetStream cluster has several servers, and a client given only one of them cannot connect
while that one is down (at start, or after a node loss before the others are learned from it).
nats-py takes a list of servers; `CORRAL_NATS_URL` (and `--nats`) is one string. So the string may
list several URLs separated by commas, each a full URL (`nats://u:p@n1:4222,nats://u:p@n2:4222`); a
URL without a user takes the first URL's user and password, so `nats://u:p@n1:4222,nats://n2:4222`
works too. Pure: string handling only.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit


def server_urls(url: str) -> list[str]:
    """The URLs in `url` (comma-separated), in order, credentials of the first carried to the others.
    ValueError naming the setting when there is none or one has no host."""
    parts = [part.strip() for part in url.split(",") if part.strip()]
    if not parts:
        raise ValueError("CORRAL_NATS_URL (--nats) is empty: give nats://HOST:PORT, or several separated by commas")
    first = urlsplit(parts[0])
    servers = []
    for part in parts:
        where = urlsplit(part if "://" in part else f"{first.scheme or 'nats'}://{part}")
        if not where.hostname:
            raise ValueError(f"CORRAL_NATS_URL (--nats): {part!r} names no host; expected nats://HOST:PORT")
        if where.username is None and first.username is not None:
            userinfo = first.netloc.rpartition("@")[0]
            where = where._replace(netloc=f"{userinfo}@{where.netloc}")
        servers.append(urlunsplit(where))
    return servers


def first_user(url: str) -> str | None:
    """The user name of the first URL (the identity the connection uses)."""
    return first_credentials(url)[0]


def first_credentials(url: str) -> tuple[str | None, str | None]:
    """User and password of the first URL (percent-decoded), None where absent."""
    first = urlsplit(server_urls(url)[0])
    return (unquote(first.username) if first.username is not None else None,
            unquote(first.password) if first.password is not None else None)


def addresses(url: str) -> str:
    """`host:port` of each server of `url`, comma-separated, without credentials: for log lines."""
    return ", ".join(f"{where.hostname}:{where.port or 4222}" for where in map(urlsplit, server_urls(url)))
