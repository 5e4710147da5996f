"""Seeing Corral run: each process's `/metrics`, `/healthz` and `/readyz` (`endpoint`, `metrics`,
`health`), JSON log lines (`logs`), and traces (`tracing`)."""
