"""The embedded simulator: a discrete-event engine, a simulated cloud (a Provider) and cluster (a ClusterBackend),
workload sources, scenario files, a driver that runs any controller against them, and reports.

Typical use::

    from gpuscale.sim.scenario import load_scenario
    from gpuscale.sim.runner import run_simulation
    from gpuscale.sim.report import format_report, write_outputs

    result = run_simulation(load_scenario("demo.yaml"), controller_factory)
    print(format_report(result.report))
    write_outputs(result.report, result.series, "out/")
"""
