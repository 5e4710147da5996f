"""CORRAL_NATS_URL may list the servers of a JetStream cluster."""

from __future__ import annotations

import pytest

from corral.bus.limits import BusLimits
from corral.bus.urls import first_credentials, first_user, server_urls


def test_one_url_is_one_server() -> None:
    assert server_urls("nats://u:p@127.0.0.1:4222") == ["nats://u:p@127.0.0.1:4222"]


def test_a_comma_separated_list_is_every_server_and_the_first_credentials_carry_over() -> None:
    assert server_urls("nats://u:p@127.0.0.1:4222, nats://127.0.0.1:4223,127.0.0.1:4224") == [
        "nats://u:p@127.0.0.1:4222", "nats://u:p@127.0.0.1:4223", "nats://u:p@127.0.0.1:4224"]
    assert server_urls("tls://a:1,tls://v:w@b:2") == ["tls://a:1", "tls://v:w@b:2"]
    assert first_user("nats://svc:pw@n1:4222,nats://n2:4222") == "svc"
    # given to nats-py as options too, so a server learned from the cluster gets them as well
    assert first_credentials("nats://svc:p%40ss@n1:4222,nats://n2:4222") == ("svc", "p@ss")
    assert first_credentials("nats://n1:4222") == (None, None)


@pytest.mark.parametrize("bad", ["", " , ", "nats://:4222"])
def test_a_url_without_a_host_names_the_setting(bad: str) -> None:
    with pytest.raises(ValueError, match="CORRAL_NATS_URL"):
        server_urls(bad)


def test_stream_replicas_come_from_the_environment_and_are_bounded() -> None:
    assert BusLimits().stream_replicas is None  # unset: an existing stream keeps its replicas
    assert BusLimits.from_env({"CORRAL_STREAM_REPLICAS": "3"}).stream_replicas == 3
    for bad in ("0", "7"):
        with pytest.raises(ValueError, match="CORRAL_STREAM_REPLICAS"):
            BusLimits.from_env({"CORRAL_STREAM_REPLICAS": bad})
