"""A chaos run's settings (`ChaosConfig`) and what it found (`ChaosReport`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tests.chaos_support.diloco_workload import Algorithm, DiLoCoSettings
from torchft_pg.chaos.plan import FaultPlan

__all__ = ["ChaosConfig", "ChaosReport"]


@dataclass(frozen=True)
class ChaosConfig:
    """A run: `replicas` groups of `group_world_size` ranks train at least `steps` steps,
    and until every planned fault fired and the job recovered. Times in seconds."""

    replicas: int = 3
    steps: int = 20
    plan: FaultPlan = field(default_factory=FaultPlan)
    group_world_size: int = 1
    pg_kind: str = "gloo"
    transport: str = "http"  # or "pg"
    min_replicas: int = 1
    # The Managers' min_replica_size: set it to `replicas` for a job that needs every
    # group in every step (a killed group's survivors wait for its restart).
    min_replica_size: int = 1
    join_timeout_ms: int = 300
    heartbeat_timeout_ms: int | None = None  # None: the lighthouse's default (5 s)
    timeout_s: float = 5.0
    quorum_timeout_s: float = 60.0
    delay_s: float = 0.6  # > join timeout: a delayed replica misses a quorum
    # FREEZE: SIGCONT after this. None: the heartbeat timeout plus the PG timeout plus 1 s,
    # so the peers have dropped the frozen replica and their abandoned collective has
    # timed out. (Resuming sooner hits a known bug: see tests/chaos/test_chaos.py.)
    freeze_s: float | None = None
    # A run fails as hung once no rank sent an event or exited for `stall_s` seconds, and
    # in any case past `deadline_s`, a bound far above any healthy run on a loaded machine
    # (`progress.py`: a fixed deadline failed healthy runs on a busy machine).
    stall_s: float = 120.0
    deadline_s: float = 1800.0
    hidden: int = 64
    seed: int = 0
    step_time_s: float = 0.02  # simulated compute per (inner) step, so survivors do not race ahead
    oracle: bool = True  # replay the committed history at the end and compare
    # DILOCO: each group trains with DiLoCo (`diloco_trainer`); a step is an outer sync,
    # the oracle is the DiLoCo replay (`diloco_oracle`). Single-rank groups only.
    algorithm: Algorithm = Algorithm.DDP
    diloco: DiLoCoSettings = field(default_factory=DiLoCoSettings)
    # The job secret every process of the run presents (None: an open job); the
    # lighthouse then refuses every call without it.
    job_secret: str | None = None
    # The Managers' integrity check: committed steps between checks (None: off). A
    # CORRUPT_STATE must be caught and healed within this many steps.
    integrity_check_every: int | None = 100
    # The lighthouse's straggler detector: steps per window (None: its default;
    # 0: off), the first quarantine's length (ms; None: its default).
    straggler_window: int | None = None
    quarantine_base_ms: int | None = None
    # FREEZE_LIGHTHOUSE / LIGHTHOUSE_OUTAGE: how long the lighthouse is away. None: its
    # heartbeat timeout plus 1 s, so it also has to forgive the silence it caused.
    lighthouse_away_s: float | None = None
    # The data-plan oracle: every rank draws its step's indices from an
    # ExactlyOnceBatchSampler on its Manager over `data_size` samples, `data_batch`
    # per rank; the committed steps must use every sample once per epoch.
    data_size: int = 97
    data_batch: int = 3
    straggle_s: float = 0.25  # STRAGGLE: seconds added to each of the straggler's steps ...
    straggle_steps: int = 200  # ... for at most this many of its steps
    verbose: bool = True
    log_level: int = logging.WARNING  # the replicas' logging (INFO shows every quorum and heal)

    def __post_init__(self) -> None:
        if self.algorithm == Algorithm.DILOCO and self.group_world_size != 1:
            raise ValueError(
                "the DiLoCo chaos mode runs single-rank replica groups, got "
                f"group_world_size={self.group_world_size}"
            )


@dataclass
class ChaosReport:
    """What happened and whether the invariants held (`failures` empty)."""

    final_steps: dict[int, int] = field(default_factory=dict)
    checksums: dict[int, str] = field(default_factory=dict)
    commits: int = 0
    faults_fired: list[tuple[int, int, str]] = field(default_factory=list)
    # every rank that killed itself as planned: (replica, group rank, step, phase)
    deaths: list[tuple[int, int, int, str]] = field(default_factory=list)
    # every freeze: (replica, group rank, step, seconds stopped, steps the others committed meanwhile)
    freezes: list[tuple[int, int, int, float, int]] = field(default_factory=list)
    # errors raised by the ranks that outlived a dead peer of their group, which
    # cannot go on without it: (replica, group rank, the error's first line)
    orphan_errors: list[tuple[int, int, str]] = field(default_factory=list)
    kills: int = 0  # replica groups that died (one per incarnation)
    restarts: int = 0
    lighthouse_restarts: int = 0
    # every FREEZE_LIGHTHOUSE and LIGHTHOUSE_OUTAGE: (fault, seconds away, commits the
    # replicas made meanwhile)
    lighthouse_away: list[tuple[str, float, int]] = field(default_factory=list)
    kill_to_survivor_commit_s: list[float] = field(default_factory=list)
    restart_to_commit_s: list[float] = field(default_factory=list)
    library_start_s: list[float] = field(
        default_factory=list
    )  # restarted replica: Manager construction
    # restarted replica: from Manager ready to its first commit (quorum, heal, one step)
    ready_to_commit_s: list[float] = field(default_factory=list)
    # ... of which: waiting for its quorum (the survivors finishing their step),
    # reconfiguring the PG, healing (Manager.last_quorum_timings, summed to the first commit)
    join_quorum_s: list[float] = field(default_factory=list)
    join_configure_s: list[float] = field(default_factory=list)
    join_heal_s: list[float] = field(default_factory=list)
    quorum_ids: list[str] = field(default_factory=list)
    # every CORRUPT_STATE: (replica, group rank, step corrupted, step healed at; -1: never)
    corruptions: list[tuple[int, int, int, int]] = field(default_factory=list)
    # every STRAGGLE: (replica, step it began, step it ended, ended by a heal)
    straggles: list[tuple[int, int, int, bool]] = field(default_factory=list)
    # what the lighthouse(s) recorded (`/status`): integrity findings, quarantines
    integrity_findings: list[dict[str, Any]] = field(default_factory=list)
    quarantines: list[dict[str, Any]] = field(default_factory=list)
    # DiLoCo: every heal, (replica, incarnation, outer step healed to, source replica)
    heals: list[tuple[int, int, int, int]] = field(default_factory=list)
    oracle_steps: int = 0  # committed (outer) steps the oracle replayed (0: it did not run)
    data_samples: int = 0  # samples the committed steps used (the data-plan oracle)
    oracle_max_error: float = 0.0  # largest |replica - replay| over the final floats
    # largest relative error of a reported loss or gradient norm against the replay's
    oracle_max_loss_error: float = 0.0
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures
