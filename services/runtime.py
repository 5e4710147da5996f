"""Where the shared service machinery lives now (this module only re-exports it).

`services/runtime.py` held settings, the lease, the service base, reason throttling, the relay,
the run loop and `main` in one file; each now has its own module:

| module | job |
|---|---|
| `corral.services.settings` | `Settings`, `DeliveryLimits` (from the environment) |
| `corral.services.lease` | `Lease`: the single-writer advisory lock |
| `corral.services.base` | `Service`: hooks, folding, appending, `new_event`, `pending_event`; `to_new_event` |
| `corral.services.reason_throttle` | `ReasonThrottle`: when a waiting job's reason is news |
| `corral.services.relay` | `relay_forever`: the outbox relay under its lease |
| `corral.services.leased_task` | `run_while_leased`: the one loop of the relay and the projector |
| `corral.services.run_loop` | `run_service`: connect, lease, rebuild, consume, reconcile |
| `corral.services.main` | `main`: the process entry point |

Import from those modules; the names here stay for code written against the old module.
"""

from __future__ import annotations

from corral.services.base import Service, to_new_event
from corral.services.lease import Lease
from corral.services.main import main
from corral.services.reason_throttle import ReasonThrottle
from corral.services.run_loop import run_service
from corral.services.settings import DeliveryLimits, Settings

__all__ = ["DeliveryLimits", "Lease", "ReasonThrottle", "Service", "Settings", "main", "run_service",
           "to_new_event"]
