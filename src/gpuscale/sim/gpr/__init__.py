"""GPR workloads in the simulator: scenarios and request streams (:mod:`.scenario`) served by the real GPR manager on
the virtual clock (:mod:`.run`)."""

from gpuscale.sim.gpr.run import (
    GprOutcome,
    GprSimResult,
    format_gpr_report,
    gpr_sim_command,
    run_gpr_simulation,
    simulate_gprs,
)
from gpuscale.sim.gpr.scenario import (
    DEFAULT_SCENARIO,
    GprScenario,
    RequestShape,
    RequestStream,
    SimRequest,
    generate_requests,
    load_gpr_scenario,
    parse_gpr_scenario,
)

__all__ = [
    "DEFAULT_SCENARIO",
    "GprOutcome",
    "GprScenario",
    "GprSimResult",
    "RequestShape",
    "RequestStream",
    "SimRequest",
    "format_gpr_report",
    "generate_requests",
    "gpr_sim_command",
    "load_gpr_scenario",
    "parse_gpr_scenario",
    "run_gpr_simulation",
    "simulate_gprs",
]
