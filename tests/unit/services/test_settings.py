"""A service process reads its environment once, in `corral.services.settings`."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.lifecycle import Limits
from corral.services.settings import PlacementSettings, Settings

SERVICES = Path(__file__).resolve().parents[3] / "services"


def test_placement_settings_are_read_with_the_others() -> None:
    settings = Settings.from_env({"CORRAL_NATS_URL": "nats://n:4222", "CORRAL_POSTGRES_DSN": "postgresql://p/db",
                                  "CORRAL_NODE_LOST_SECONDS": "3", "CORRAL_MASTER_ADDR": "10.0.0.1",
                                  "CORRAL_START_TIMEOUT_SECONDS": "7"})
    assert settings.placement == PlacementSettings(node_lost_seconds=3.0, master_addr="10.0.0.1",
                                                   limits=Limits(start_timeout=7.0))


def test_the_deciding_services_read_no_environment_of_their_own() -> None:
    """Admission, quota, placement, preemption and the shared loop read what they need from
    `Settings`; the node agent and the gateway are processes of their own (their `__main__`)."""
    readers = sorted(str(p.relative_to(SERVICES)) for p in SERVICES.rglob("*.py")
                     if p.parts[len(SERVICES.parts)] not in ("node_agent", "gateway") and p.name != "settings.py"
                     and ("os.environ" in p.read_text() or "getenv(" in p.read_text()))
    assert not readers, readers


def test_the_deciding_services_decide_by_the_policy_the_settings_name() -> None:
    """`corral up --policy fair-las` sets CORRAL_POLICY; quota, placement and preemption each take
    the policy's configuration from the settings they are started with (the core's default without)."""
    from corral.core import SchedulerConfig
    from corral.services.placement.service import Placement
    from corral.services.preemption.service import Preemption
    from corral.services.quota.service import Quota

    env = {"CORRAL_NATS_URL": "nats://n:4222", "CORRAL_POSTGRES_DSN": "postgresql://p/db"}
    settings = Settings.from_env({**env, "CORRAL_POLICY": "fair-las"})
    assert Settings.from_env(env).policy == "corral"
    for service in (Quota, Placement, Preemption):
        assert service(None, None, settings=settings).config == SchedulerConfig.named("fair-las")  # type: ignore[arg-type]
        assert service(None, None).config == SchedulerConfig()  # type: ignore[arg-type]
    with pytest.raises(SystemExit, match="choose one of"):
        Settings.from_env({**env, "CORRAL_POLICY": "shortest"})
