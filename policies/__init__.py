"""Cost-aware scaling policies (installed as `astraflow.policies`).

A leaf package like `astraflow.stores`: it imports neither the runtime, torch,
modal nor sky (tested), so a policy can be written, simulated and unit-tested
anywhere, then applied to a real run by `astraflow scale` (which finds a policy by
name, built-in or `module:attr`, through astraflow.registry.make_policy).

    from astraflow.policies import CostAware, Scenario, Workload, simulate
    run = simulate(scenario, CostAware())          # cost, GPU-hours, trainer wait
    plan = CostAware().plan(observation)           # Plan(targets={pool: n}, reason=...)

Modules: `api` (Observation, Pool, Plan, Policy), `builtin` (fixed, deadband),
`cost` (the cost-aware policy and its typed `CostConfig`), `prices` (SkyPilot catalog
or a CSV), `egress` ($/GB between regions and clouds, bytes a run moves), `traces` (spot capacity traces), `scaling_sim` (the policies replayed over
a run, on the discrete-event engine of `events`).
"""

from astraflow.policies.api import (
    Decision,
    Observation,
    Plan,
    Policy,
    Pool,
    PoolState,
    ScalingPolicy,
    TrainerState,
)
from astraflow.policies.builtin import DeadBand, Fixed
from astraflow.policies.cost import CostAware, CostConfig
from astraflow.policies.egress import EgressTable, Traffic, default_egress, read_egress
from astraflow.policies.prices import Catalog, PriceRow, load_prices, read_csv
from astraflow.policies.scaling_sim import Scenario, SimRun, Workload, format_runs, simulate
from astraflow.policies.traces import SpotTrace, load_trace

__all__ = [
    "Catalog", "CostAware", "CostConfig", "DeadBand", "Decision", "EgressTable", "Fixed",
    "Observation", "Plan", "Policy", "Pool", "PoolState", "PriceRow", "ScalingPolicy", "Scenario",
    "SimRun", "SpotTrace", "Traffic", "TrainerState", "Workload", "default_egress", "format_runs",
    "load_prices", "load_trace", "read_csv", "read_egress", "simulate",
]
