"""The reconcile loop shared by every backend (simulated cluster, Kubernetes)."""
