"""Corral: a GPU scheduler and cluster orchestrator."""

__version__ = "0.1.0"
