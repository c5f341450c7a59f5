"""Fault injection for a fault-tolerant job: seeded fault plans and faults inside a step.

A `FaultPlan` says which fault hits which replica group at which step,
reproducibly from a seed; the `injection` wrappers (process group, heal
transport, Manager) land a fault in a chosen phase of a step.
"""

from torchft_pg.chaos.injection import (
    Action,
    FaultInjectingManager,
    FaultInjectingProcessGroup,
    FaultInjectingTransport,
    Injector,
    Phase,
)
from torchft_pg.chaos.plan import CLASSIC_FAULTS, PHASE_FAULTS, Fault, FaultPlan

__all__ = [
    "CLASSIC_FAULTS",
    "PHASE_FAULTS",
    "Action",
    "Fault",
    "FaultInjectingManager",
    "FaultInjectingProcessGroup",
    "FaultInjectingTransport",
    "FaultPlan",
    "Injector",
    "Phase",
]
