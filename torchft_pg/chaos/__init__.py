"""Chaos testing for fault-tolerant training: fault plans, a reference trainer, a supervisor.

from torchft_pg.chaos import ChaosConfig, FaultPlan, run_chaos
report = run_chaos(ChaosConfig(replicas=3, steps=30, plan=FaultPlan.random(seed=1, replicas=3, steps=30, kills=5)))
assert report.ok, report.failures
"""

from torchft_pg.chaos.plan import CLASSIC_FAULTS, PHASE_FAULTS, Fault, FaultPlan
from torchft_pg.chaos.supervisor import ChaosConfig, ChaosReport, run_chaos

__all__ = [
    "CLASSIC_FAULTS",
    "PHASE_FAULTS",
    "ChaosConfig",
    "ChaosReport",
    "Fault",
    "FaultPlan",
    "run_chaos",
]
