"""Fault-tolerant training, live: a lighthouse and 3 replica groups on this machine.

Replica 1 is killed with SIGKILL at a chosen step and restarted; the others
keep committing, the restarted one heals from a live peer, and every replica
ends with identical parameters. One line per step, then a summary.

The replicas run this repository's reference trainer under its chaos
supervisor (`run_chaos`, from the test support package beside the library,
not in the wheel); the kill comes from the library's own fault plan.

    python examples/demo.py [--replicas 3] [--steps 40] [--kill-step 10] [--pg gloo|baby]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

# The supervisor and its reference trainer live in the repository's test support package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.chaos_support import ChaosConfig, run_chaos
from torchft_pg.chaos import Fault, FaultPlan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3, help="replica groups (default 3)")
    parser.add_argument("--steps", type=int, default=40, help="steps to train (default 40)")
    parser.add_argument(
        "--kill-step", type=int, default=10, help="step at which replica 1 is killed"
    )
    parser.add_argument("--kill-replica", type=int, default=1, help="which replica group to kill")
    parser.add_argument(
        "--pg", choices=["gloo", "baby"], default="gloo", help="cross-replica process group"
    )
    parser.add_argument(
        "--step-time", type=float, default=0.05, help="simulated compute per step (s)"
    )
    args = parser.parse_args()
    if not 0 <= args.kill_replica < args.replicas:
        parser.error(f"--kill-replica must be in [0, {args.replicas}), got {args.kill_replica}")
    if not 0 <= args.kill_step < args.steps:
        parser.error(f"--kill-step must be in [0, {args.steps}), got {args.kill_step}")

    # Everything runs on this machine, so every server listens on loopback and advertises
    # it: the lighthouse binds 127.0.0.1 (run_chaos), and each replica's manager and
    # checkpoint servers follow these, whatever the shell exports. Nothing is reachable
    # from the network, and no server warns that it is.
    os.environ["TORCHFT_BIND_HOST"] = "127.0.0.1"
    os.environ["TORCHFT_HOSTNAME"] = "127.0.0.1"
    plan = FaultPlan({(args.kill_replica, args.kill_step): Fault.KILL_REPLICA})
    report = run_chaos(
        ChaosConfig(
            replicas=args.replicas,
            steps=args.steps,
            plan=plan,
            pg_kind=args.pg,
            step_time_s=args.step_time,
            deadline_s=600,
        )
    )

    print("\nsummary")
    print(f"  steps committed (all replicas)        {report.commits}")
    print(f"  final step per replica                {dict(sorted(report.final_steps.items()))}")
    if report.kill_to_survivor_commit_s:
        print(
            f"  kill -> survivors' next commit         {statistics.median(report.kill_to_survivor_commit_s):.3f} s"
        )
    if report.restart_to_commit_s:
        print(
            f"  restart -> healed and committing       {statistics.median(report.restart_to_commit_s):.3f} s"
        )
    if report.library_start_s:
        print(
            f"  of which Manager start-up              {statistics.median(report.library_start_s):.3f} s"
        )
    same = len(set(report.checksums.values())) == 1
    print(f"  parameter checksums                   {dict(sorted(report.checksums.items()))}")
    print(f"  parameters identical across replicas  {'yes' if same else 'NO'}")
    if not report.ok:
        print("FAILED:\n  " + "\n  ".join(report.failures))
        raise SystemExit(1)
    print("ok")


if __name__ == "__main__":
    main()
