"""GPU Provisioning Requests, imperative shell: SQLite store, manager (reconcile through a provider), REST API,
server and CLI. The decisions live in the pure :mod:`gpuscale.core.gpr`."""
