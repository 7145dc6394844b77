"""Workload scaling commands: ``gpuscale scaler replay`` and ``gpuscale rightsize`` (the shell around
:mod:`gpuscale.core.autoscale`)."""
