"""The node agent: one per node; discovers GPUs and runs the node's share of gangs as processes.

Floors, lowest first (import-linter checks them): `host` (what the machine has: GPUs, their
health, pressure, ports, interfaces), `process` (a stepd per gang attempt that runs the ranks and
outlives the agent, the files it writes, the supervisor that starts, follows, commands and adopts
stepds), `reporting` (reports and rank output to the bus), then `reservation` (what this node must
run of a GangReserved) and `service` (one agent per node wired to JetStream), and `__main__`, the
one entry point. Whether a gang restarts or fails is placement's decision (`corral.lifecycle`),
which sees every node of the gang.
"""
