"""What the agent knows of its machine: its GPUs (`inventory`), their health (`gpu_health`), disk
and memory pressure (`pressure`), the ports it must keep rendezvous out of (`ephemeral_ports`) and
the network interface of its advertised address (`interfaces`).

The lowest floor of the agent: it imports nothing else of it.
"""
