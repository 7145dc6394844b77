"""Trace adapters: read public cluster traces (files) into core types."""

from gpuscale.traces.openb import TracePod, load_nodes, load_pods

__all__ = ["TracePod", "load_nodes", "load_pods"]
