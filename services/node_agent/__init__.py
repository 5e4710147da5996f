"""The node agent: one per node; discovers GPUs and runs the node's share of gangs as processes.

Bus-independent core: `inventory` (what the node has), `assignment` (what to run, rank env),
`supervisor` (real processes: start, watch, preempt, tear down, report through `AgentEvents`).
The service adapter wires these to JetStream. Whether a gang restarts or fails is placement's
decision (`corral.lifecycle`), which sees every node of the gang.
"""
