"""The processes of a node's gangs: a stepd per gang attempt (`stepd`, forked by the `zygote`
through `fork_server`), the files it and the agent talk through (`step_files`, `control`), how a
rank starts (`assignment`, `runtimes`, `sandbox_layout`, `run_as`, `rank_output`), the agent's side
that starts, follows, commands and adopts them (`supervisor`, `adoption`), and the in-agent timers
of the `sim-timer` runtime (`timer_supervisor`).

Below the reports and the service; above the host. Stdlib-only where the stepd imports it.
"""
