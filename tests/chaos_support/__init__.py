"""This project's chaos verification: a reference trainer, a supervisor that runs it, oracles.

The supervisor (`run_chaos`) starts a lighthouse and N replica groups of the
reference trainer on this machine, fires a `torchft_pg.chaos.FaultPlan` at
them with the shipped fault injection, restarts what dies and checks every
commit against a ledger and, at the end, a bit-exact replay. None of it ships
in the wheel: it verifies the library, it does not run a user's job.

    from tests.chaos_support import ChaosConfig, run_chaos
    from torchft_pg.chaos import FaultPlan

    report = run_chaos(ChaosConfig(replicas=3, steps=30, plan=FaultPlan.random(seed=1, replicas=3, steps=30, kills=5)))
    assert report.ok, report.failures
"""

from tests.chaos_support.config import ChaosConfig, ChaosReport
from tests.chaos_support.supervisor import run_chaos

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos"]
