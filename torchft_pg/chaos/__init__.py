"""Fault injection for a fault-tolerant job: a seeded plan, fired by each rank at its steps.

Every rank builds the same `FaultPlan` (from one seed) and a `ReplicaFaults`
for its replica group, wraps its process group with it, builds its Manager
as a `FaultInjectingManager` (which wraps its heal transport), and calls
`fire_due(step)` before each forward and `after_forward()` before each
backward::

    plan = FaultPlan.random(seed=1, replicas=3, steps=300, kills=4, other_faults=4)
    faults = ReplicaFaults(plan, replica=replica_index, record=f"/tmp/faults.{replica_index}.{rank}")
    pg = faults.wrap_process_group(ProcessGroupGloo(timeout=timedelta(seconds=10)))
    manager = FaultInjectingManager(pg, injector=faults.injector, ...)  # Manager's arguments
    while training:
        faults.fire_due(manager.current_step())
        loss = model(batch)  # (name the state a CORRUPT_STATE flips: faults.watch_state)
        faults.after_forward()
        loss.backward()
        optimizer.step()
"""

from torchft_pg.chaos.corruption import BitFlip
from torchft_pg.chaos.injection import (
    Action,
    FaultInjectingManager,
    FaultInjectingProcessGroup,
    FaultInjectingTransport,
    Injector,
    Phase,
)
from torchft_pg.chaos.plan import (
    CLASSIC_FAULTS,
    HEALTH_FAULTS,
    LIGHTHOUSE_FAULTS,
    PHASE_FAULTS,
    Fault,
    FaultPlan,
)
from torchft_pg.chaos.replica_faults import ReplicaFaults

__all__ = [
    "CLASSIC_FAULTS",
    "HEALTH_FAULTS",
    "LIGHTHOUSE_FAULTS",
    "PHASE_FAULTS",
    "Action",
    "BitFlip",
    "Fault",
    "FaultInjectingManager",
    "FaultInjectingProcessGroup",
    "FaultInjectingTransport",
    "FaultPlan",
    "Injector",
    "Phase",
    "ReplicaFaults",
]
