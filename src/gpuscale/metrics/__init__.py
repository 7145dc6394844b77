"""Metrics in and out: a Prometheus HTTP API client (:mod:`.prometheus`), the DCGM-compatible GPU exporter behind
``gpuscale agent`` (:mod:`.agent`, :mod:`.gpus`) and the metric names the dashboard and rules rely on
(:mod:`.names`). An adapter layer: it observes, the core decides."""
