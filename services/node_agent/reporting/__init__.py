"""What the agent tells the rest of Corral: its reports as events, published in order (`reports`),
and each rank's output shipped to the bus in bounded chunks (`log_chunks`, `log_shipper`).

Above the processes (it reports what they did); below the service that wires it to NATS.
"""
