"""A torchx component for a fault-tolerant job: one lighthouse role and one role per
replica group, each group a single-node ``torchrun`` of the training script.

    torchx run -s local_cwd examples/launch/torchx_component.py:fault_tolerant_job \\
        --script examples/train_ddp.py --replica_groups 2 --nproc_per_node 1 \\
        --job_secret_file ~/.torchft-job-secret --env STEPS=20

The lighthouse is the application's first role on purpose: every torchx scheduler
names, in each role's environment, a variable holding the host of the first role's
first replica (``macros.rank0_env``: ``TORCHX_RANK0_HOST`` on the local schedulers,
the Volcano host list on Kubernetes, the first het group's nodes on Slurm), which is
how the replica groups find the lighthouse wherever it was placed.

Each replica group is its own role, so a scheduler that restarts single replicas
(``RetryPolicy.REPLICA``) restarts one group while the others keep training; the
lighthouse role ends once no group has been alive for ``exit_when_idle_s`` seconds
(``lighthouse_role.py``), so the application finishes when training does.

This file is read by torchx's component linter, which accepts only ``typing`` names
(``Optional[Dict[str, str]]``) in parameter annotations and evaluates them at run
time, hence no ``from __future__ import annotations`` and the ``noqa`` below.
"""

import shlex
from typing import Dict, Optional  # noqa: UP035

from torchx import specs

LIGHTHOUSE_ROLE = "lighthouse"
LIGHTHOUSE_WRAPPER = "examples/launch/lighthouse_role.py"


def replica_group_role_name(group: int) -> str:
    """The role name of replica group ``group`` (also its REPLICA_GROUP_ID)."""
    return f"replica_group_{group}"


def fault_tolerant_job(
    *script_args: str,
    script: str,
    job_secret_file: str,
    replica_groups: int = 2,
    nproc_per_node: int = 1,
    image: str = "torchft-pg:latest",
    name: str = "torchft-pg",
    job_id: str = "",
    min_replicas: int = 1,
    lighthouse_port: int = 29510,
    lighthouse_http_port: int = 29511,
    lighthouse_state_file: str = "auto",
    exit_when_idle_s: int = 300,
    max_retries: int = 3,
    cpu: int = 8,
    gpu: int = 0,
    memMB: int = 32768,
    env: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
) -> specs.AppDef:
    """A lighthouse plus ``replica_groups`` replica groups of ``nproc_per_node`` ranks.

    Args:
        script_args: arguments passed on to the training script
        script: the training script, relative to the image's working directory
        job_secret_file: path, on every host, of the job secret (16+ characters,
            readable only by the job's user); never the secret itself
        replica_groups: number of replica groups, each one role of one node
        nproc_per_node: ranks (GPUs) per replica group
        image: container image with torchft_pg and the script (ignored by local_cwd)
        name: application name
        job_id: the job id the lighthouse admits; empty: the torchx app id
        min_replicas: fewest replica groups the lighthouse forms a quorum with
        lighthouse_port: the lighthouse's gRPC port
        lighthouse_http_port: the lighthouse's status/metrics port
        lighthouse_state_file: where the lighthouse keeps the committed step ("auto":
            the user's state directory, ~/.local/state/torchft-pg)
        exit_when_idle_s: seconds without a live replica group after which the
            lighthouse role ends (successfully)
        max_retries: restarts of each replica group (its role only) before the job fails
        cpu: CPUs per replica group
        gpu: GPUs per replica group
        memMB: memory per replica group, in MiB
        env: extra environment for the replica groups (e.g. STEPS=100,TORCHFT_HOSTNAME=...)
    """
    _check_positive(replica_groups=replica_groups, nproc_per_node=nproc_per_node)
    _check_positive(min_replicas=min_replicas, exit_when_idle_s=exit_when_idle_s)
    for port_name, port in (
        ("lighthouse_port", lighthouse_port),
        ("lighthouse_http_port", lighthouse_http_port),
    ):
        if not 0 < port < 65536:
            raise ValueError(f"{port_name} must be in [1, 65535], got {port}")
    if not job_secret_file.strip():
        raise ValueError("job_secret_file must name the job secret's file, got an empty path")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    job = job_id or specs.macros.app_id
    lighthouse = specs.Role(
        name=LIGHTHOUSE_ROLE,
        image=image,
        entrypoint="python",
        args=[
            LIGHTHOUSE_WRAPPER,
            "--exit-when-idle-s",
            str(exit_when_idle_s),
            "--",
            "--bind",
            f"[::]:{lighthouse_port}",
            "--http-bind",
            f"[::]:{lighthouse_http_port}",
            "--min-replicas",
            str(min_replicas),
            "--job-secret-file",
            job_secret_file,
            "--job-id",
            job,
            "--state-file",
            lighthouse_state_file,
        ],
        resource=specs.Resource(cpu=1, gpu=0, memMB=2048),
        port_map={"grpc": lighthouse_port, "http": lighthouse_http_port},
    )
    # "$${" is torchx's escape for a literal "${": the shell, not torchx, expands the
    # variable whose name the rank0_env macro becomes.
    lighthouse_host = f"$${{{specs.macros.rank0_env}:-localhost}}"
    torchrun = shlex.join(
        [
            "torchrun",
            "--nnodes=1",
            f"--nproc_per_node={nproc_per_node}",
            "--standalone",
            script,
            *script_args,
        ]
    )
    groups = [
        specs.Role(
            name=replica_group_role_name(group),
            image=image,
            entrypoint="bash",
            args=[
                "-c",
                f'TORCHFT_LIGHTHOUSE="{lighthouse_host}:{lighthouse_port}" exec {torchrun}',
            ],
            env={
                **(env or {}),
                "REPLICA_GROUP_ID": str(group),
                "NUM_REPLICA_GROUPS": str(replica_groups),
                "TORCHFT_JOB_SECRET_FILE": job_secret_file,
                "TORCHFT_JOB_ID": job,
            },
            resource=specs.Resource(cpu=cpu, gpu=gpu, memMB=memMB),
            max_retries=max_retries,
            retry_policy=specs.RetryPolicy.REPLICA,
        )
        for group in range(replica_groups)
    ]
    return specs.AppDef(name=name, roles=[lighthouse, *groups])


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
