"""gpuscale: dynamic GPU node allocation for Kubernetes."""

__version__ = "0.1.0"
