"""The node agent: one per node; discovers GPUs and runs the node's share of gangs as processes.

Bus-independent core: `inventory` (what the node has), `assignment` (what to run, rank env),
`stepd` (one process per gang attempt: runs the ranks, outlives the agent, writes `step_files`),
`supervisor` (starts, follows, commands and adopts stepds, reports through `AgentEvents`),
`adoption` (which adopted gangs the log still wants). The service adapter wires these to
JetStream. Whether a gang restarts or fails is placement's decision (`corral.lifecycle`), which
sees every node of the gang.
"""
