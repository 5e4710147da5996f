"""The node agent: one per node; discovers GPUs and runs the node's share of gangs as processes.

Bus-independent core: `inventory` (what the node has), `assignment` (what to run, rank env),
`supervisor` (real processes: start, watch, preempt, tear down, report through `AgentEvents`),
`barrier` and `restart_policy` (pure decisions). The service adapter wires these to JetStream.
"""
