"""The cluster launch recipes in examples/launch/, checked without a cluster.

Slurm: the batch script runs for real under bash, with fake ``srun``, ``scontrol`` and
``hostname`` first on PATH that record what they were asked to run. Kubernetes: every
manifest against the API's OpenAPI schemas (offline, strict: unknown fields fail),
then the references between them. torchx: the component's AppDef and torchx's own
component linter (the local run is tests/integration/test_launch_recipes.py). The
lighthouse role's idle rule is pure and checked with a fake clock.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from torchx import specs
from torchx.specs.file_linter import validate as lint_component

from examples.launch.lighthouse_role import IdleRule, IdleWatch, Verdict, status_url
from examples.launch.torchx_component import (
    LIGHTHOUSE_ROLE,
    fault_tolerant_job,
    replica_group_role_name,
)
from lighthouse.coordinator.cli import build_parser as lighthouse_parser

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "examples" / "launch"
SBATCH = LAUNCH / "slurm.sbatch"
K8S_VERSIONS = ("1.33.0", kubernetes_validate.latest_version())  # backoffLimitPerIndex: GA 1.33
SECRET = "0123456789abcdef0123456789abcdef"
NODES = ("gpu-a01", "gpu-a02", "gpu-a03")
SCRIPT_TIMEOUT_S = 60.0  # the batch script under the fakes takes well under a second

# --- Slurm -----------------------------------------------------------------------------

# One fake for srun, scontrol and hostname (it acts on the name it was called by). Each
# call writes one JSON file into $FAKE_LOG. srun reads its own --export as srun would.
# A lighthouse step serves until SIGTERM (at most 60 s); a torchrun step fails once for
# the group in $FAKE_FAIL_ONCE_GROUP, else succeeds.
_FAKE = r"""
import json, os, signal, stat, sys, threading, uuid
log = os.environ["FAKE_LOG"]
tool = os.path.basename(sys.argv[0])

def record(entry):
    with open(os.path.join(log, f"{tool}-{uuid.uuid4().hex}.json"), "w") as f:
        json.dump({"tool": tool, **entry}, f)

def secret_file_facts(path):
    st = os.stat(path)
    return {"mode": stat.S_IMODE(st.st_mode), "chars": len(open(path).read().strip())}

if tool == "hostname":
    record({"argv": sys.argv[1:]})
    print("login-node-not-in-the-job")
    sys.exit(0)
if tool == "scontrol":
    record({"argv": sys.argv[1:]})
    if sys.argv[1:3] != ["show", "hostnames"]:
        sys.exit(2)
    print("\n".join(os.environ["FAKE_NODES"].split()))
    sys.exit(0)
options, command = [], []
for i, arg in enumerate(sys.argv[1:]):
    if not arg.startswith("-"):
        command = sys.argv[1 + i:]
        break
    options.append(arg)
export = {}
for opt in options:
    if opt.startswith("--export="):
        for item in opt.split("=", 1)[1].split(",")[1:]:
            key, _, value = item.partition("=")
            export[key] = value
env = {**os.environ, **export}
entry = {"options": options, "command": command, "export": export,
         "inherited_secret": "TORCHFT_JOB_SECRET" in env}
if command and command[0] == "torchft-pg-lighthouse":
    path = command[command.index("--job-secret-file") + 1]
    entry["secret_file"] = secret_file_facts(path)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    record(entry)
    open(os.path.join(log, "lighthouse-up"), "w").close()  # groups may now "connect"
    entry["stopped_by_sigterm"] = stopped.wait(60)
    record({**entry, "phase": "end"})
    sys.exit(0 if entry["stopped_by_sigterm"] else 1)
entry["secret_file"] = secret_file_facts(env["TORCHFT_JOB_SECRET_FILE"])
# A real group reaches the lighthouse before it trains: wait until the fake one is up
# (its SIGTERM handler set), so the script cannot stop it before it even started.
for _ in range(3000):
    if os.path.exists(os.path.join(log, "lighthouse-up")):
        break
    threading.Event().wait(0.01)
group = export.get("REPLICA_GROUP_ID")
marker = os.path.join(log, f"failed-once-{group}")
if group == os.environ.get("FAKE_FAIL_ONCE_GROUP") and not os.path.exists(marker):
    open(marker, "w").close()
    record({**entry, "exit": 1})
    sys.exit(1)
record({**entry, "exit": 0})
"""


@dataclass(frozen=True, kw_only=True)
class SbatchRun:
    """One run of the batch script: its exit status, stderr and the fakes' records."""

    returncode: int
    stderr: str
    calls: list[dict[str, Any]]

    def srun(self, program: str) -> list[dict[str, Any]]:
        return [
            c
            for c in self.calls
            if c["tool"] == "srun" and c["command"][:1] == [program] and "phase" not in c
        ]

    def lighthouse_end(self) -> dict[str, Any]:
        (end,) = [c for c in self.calls if c.get("phase") == "end"]
        return end


def run_sbatch(tmp_path: Path, *train_args: str, **env: str) -> SbatchRun:
    """Run slurm.sbatch under the fakes; ``env`` adds to (or, empty, removes from) the
    job's environment."""
    fakes, log, home = tmp_path / "bin", tmp_path / "log", tmp_path / "home"
    for d in (fakes, log, home):
        d.mkdir(exist_ok=True)
    fake = fakes / "fake_tool.py"
    fake.write_text(f"#!{sys.executable} -S\n{_FAKE}")  # -S: stdlib only, starts faster
    fake.chmod(0o755)
    for tool in ("srun", "scontrol", "hostname"):
        link = fakes / tool
        if not link.exists():
            link.symlink_to(fake)
    job_env = {
        "PATH": f"{fakes}:/usr/bin:/bin",
        "HOME": str(home),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-a[01-03]",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_GPUS_ON_NODE": "8",
        "FAKE_LOG": str(log),
        "FAKE_NODES": " ".join(NODES),
    }
    for key, value in env.items():
        if value:
            job_env[key] = value
        else:
            job_env.pop(key, None)
    done = subprocess.run(
        ["bash", str(SBATCH), *train_args],
        env=job_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    calls = [json.loads(p.read_text()) for p in sorted(log.glob("*.json"))]
    return SbatchRun(returncode=done.returncode, stderr=done.stderr, calls=calls)


def private_secret(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "job-secret"
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    return path


def option(options: list[str], name: str) -> str:
    (value,) = [o.split("=", 1)[1] for o in options if o.startswith(f"{name}=")]
    return value


def test_sbatch_header_asks_for_one_task_per_node() -> None:
    header = [line for line in SBATCH.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --ntasks-per-node=1" in header
    assert any(line.startswith("#SBATCH --nodes=") for line in header)
    first_command = next(
        i
        for i, line in enumerate(SBATCH.read_text().splitlines())
        if line and not line.startswith("#")
    )
    last_header = max(
        i for i, line in enumerate(SBATCH.read_text().splitlines()) if line.startswith("#SBATCH")
    )
    assert last_header < first_command, "sbatch reads #SBATCH lines only before the first command"


def test_sbatch_starts_one_lighthouse_on_the_first_node(tmp_path: Path) -> None:
    secret = private_secret(tmp_path)
    run = run_sbatch(tmp_path, TORCHFT_JOB_SECRET_FILE=str(secret))
    assert run.returncode == 0, run.stderr
    (lh,) = run.srun("torchft-pg-lighthouse")
    assert option(lh["options"], "--nodelist") == NODES[0]
    assert option(lh["options"], "--nodes") == "1"
    args = lighthouse_parser().parse_args(lh["command"][1:])  # the real CLI accepts them
    assert args.bind == f"{NODES[0]}:29510"
    assert args.http_bind == f"{NODES[0]}:29511"
    assert args.job_secret_file == str(secret)
    assert args.job_id == "slurm-4242"
    assert args.state_file == f"{tmp_path}/torchft-pg-lighthouse-4242.state.json"
    assert SECRET not in json.dumps(run.calls), "the secret itself must not be on a command line"
    # The lighthouse was still serving when every group had finished, then stopped.
    assert run.lighthouse_end()["stopped_by_sigterm"] is True
    assert not [c for c in run.calls if c["tool"] == "hostname"]


def test_sbatch_runs_one_torchrun_per_node_with_the_job_env(tmp_path: Path) -> None:
    secret = private_secret(tmp_path)
    run = run_sbatch(
        tmp_path, "--lr", "0.1", TORCHFT_JOB_SECRET_FILE=str(secret), TRAIN_SCRIPT="train.py"
    )
    assert run.returncode == 0, run.stderr
    groups = sorted(run.srun("torchrun"), key=lambda c: int(c["export"]["REPLICA_GROUP_ID"]))
    assert [c["export"]["REPLICA_GROUP_ID"] for c in groups] == ["0", "1", "2"]
    for group, (call, node) in enumerate(zip(groups, NODES, strict=True)):
        assert option(call["options"], "--nodelist") == node
        assert option(call["options"], "--export").startswith("ALL,")
        assert call["export"] == {
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": "3",
            "TORCHFT_LIGHTHOUSE": f"{NODES[0]}:29510",
            "TORCHFT_HOSTNAME": node,
            "TORCHFT_JOB_SECRET_FILE": str(secret),
            "TORCHFT_JOB_ID": "slurm-4242",
        }
        assert call["command"] == [
            "torchrun",
            "--nnodes=1",
            "--nproc_per_node=8",
            f"--master_addr={node}",
            "--master_port=29600",
            "train.py",
            "--lr",
            "0.1",
        ]


def test_sbatch_address_suffix_picks_the_network(tmp_path: Path) -> None:
    secret = private_secret(tmp_path)
    run = run_sbatch(tmp_path, TORCHFT_JOB_SECRET_FILE=str(secret), NODE_ADDR_SUFFIX="-ib")
    assert run.returncode == 0, run.stderr
    (lh,) = run.srun("torchft-pg-lighthouse")
    assert option(lh["options"], "--nodelist") == NODES[0]  # Slurm's name for the node
    assert lighthouse_parser().parse_args(lh["command"][1:]).bind == f"{NODES[0]}-ib:29510"
    for call in run.srun("torchrun"):
        assert call["export"]["TORCHFT_LIGHTHOUSE"] == f"{NODES[0]}-ib:29510"
        assert call["export"]["TORCHFT_HOSTNAME"].endswith("-ib")


def test_sbatch_restarts_a_failed_group_alone(tmp_path: Path) -> None:
    secret = private_secret(tmp_path)
    run = run_sbatch(tmp_path, TORCHFT_JOB_SECRET_FILE=str(secret), FAKE_FAIL_ONCE_GROUP="1")
    assert run.returncode == 0, run.stderr
    per_group = [c["export"]["REPLICA_GROUP_ID"] for c in run.srun("torchrun")]
    assert sorted(per_group) == ["0", "1", "1", "2"]
    assert "replica group 1 on gpu-a02 failed (attempt 1 of 4)" in run.stderr
    assert len(run.srun("torchft-pg-lighthouse")) == 1


def test_sbatch_fails_when_a_group_runs_out_of_restarts(tmp_path: Path) -> None:
    secret = private_secret(tmp_path)
    run = run_sbatch(
        tmp_path,
        TORCHFT_JOB_SECRET_FILE=str(secret),
        FAKE_FAIL_ONCE_GROUP="2",
        MAX_RESTARTS="0",
    )
    assert run.returncode == 1
    assert len(run.srun("torchrun")) == 3
    assert run.lighthouse_end()["stopped_by_sigterm"] is True


def test_sbatch_refuses_a_secret_others_can_read(tmp_path: Path) -> None:
    secret = private_secret(tmp_path, mode=0o644)
    run = run_sbatch(tmp_path, TORCHFT_JOB_SECRET_FILE=str(secret))
    assert run.returncode == 2
    assert f"{secret} has mode 644" in run.stderr
    assert "chmod 600" in run.stderr
    assert not [c for c in run.calls if c["tool"] == "srun"]


def test_sbatch_makes_a_private_secret_for_the_job_and_removes_it(tmp_path: Path) -> None:
    run = run_sbatch(tmp_path, TORCHFT_JOB_SECRET_FILE="", TORCHFT_JOB_SECRET="from-the-shell")
    assert run.returncode == 0, run.stderr
    made = tmp_path / "home" / ".torchft-pg" / "job-4242.secret"
    launched = [*run.srun("torchft-pg-lighthouse"), *run.srun("torchrun")]
    assert len(launched) == 4
    for call in launched:
        assert call["secret_file"] == {"mode": 0o600, "chars": 48}
        assert call["inherited_secret"] is False  # the shell's secret would win over the file
    for call in run.srun("torchrun"):
        assert call["export"]["TORCHFT_JOB_SECRET_FILE"] == str(made)
    assert not made.exists()


def test_sbatch_names_a_bad_setting(tmp_path: Path) -> None:
    secret = private_secret(tmp_path)
    run = run_sbatch(tmp_path, TORCHFT_JOB_SECRET_FILE=str(secret), NPROC_PER_NODE="eight")
    assert run.returncode == 2
    assert "NPROC_PER_NODE must be a non-negative integer, got 'eight'" in run.stderr


# --- Kubernetes ------------------------------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    """Every object in examples/launch/kubernetes/, by ``Kind/name``."""
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted((LAUNCH / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def flags_of(container: dict[str, Any]) -> Any:
    assert container["command"] == ["torchft-pg-lighthouse"]
    return lighthouse_parser().parse_args(container["args"])


def test_k8s_recipe_has_the_expected_objects() -> None:
    assert sorted(manifests()) == [
        "Deployment/torchft-pg-lighthouse",
        "Job/torchft-pg-replica-groups",
        "Service/torchft-pg-lighthouse",
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_match_the_api_schema(version: str) -> None:
    for key, obj in manifests().items():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{key} is not a valid {version} object: {exc}")


def test_k8s_schema_check_catches_mistakes() -> None:
    """The check above is not vacuous: a misspelt field and a wrong type both fail."""
    job = manifests()["Job/torchft-pg-replica-groups"]
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["completions"] = "two"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


def test_k8s_service_selects_the_lighthouse_on_its_ports() -> None:
    objs = manifests()
    deployment = objs["Deployment/torchft-pg-lighthouse"]
    service = objs["Service/torchft-pg-lighthouse"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # never two lighthouses
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    flags = flags_of(container)
    assert ports == {
        "grpc": int(flags.bind.rsplit(":", 1)[1]),
        "http": int(flags.http_bind.rsplit(":", 1)[1]),
    }
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "grpc": "grpc",
        "http": "http",
    }
    assert container["readinessProbe"]["httpGet"]["port"] in ports


def test_k8s_replica_groups_find_the_lighthouse_and_share_its_secret_and_job() -> None:
    objs = manifests()
    deployment = objs["Deployment/torchft-pg-lighthouse"]
    service = objs["Service/torchft-pg-lighthouse"]
    job = objs["Job/torchft-pg-replica-groups"]
    (lh,) = deployment["spec"]["template"]["spec"]["containers"]
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    env = env_of(trainer)
    flags = flags_of(lh)

    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert env["TORCHFT_LIGHTHOUSE"]["value"] == f"{service['metadata']['name']}:{grpc_port}"
    assert env["TORCHFT_JOB_ID"]["value"] == flags.job_id

    secret_names = set()
    for pod, secret_path in (
        (deployment["spec"]["template"]["spec"], flags.job_secret_file),
        (job["spec"]["template"]["spec"], env["TORCHFT_JOB_SECRET_FILE"]["value"]),
    ):
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
        (item,) = volume["secret"]["items"]
        assert f"{mount['mountPath']}/{item['path']}" == secret_path
        assert mount["readOnly"] is True
        assert volume["secret"]["defaultMode"] == 0o400
        secret_names.add((volume["secret"]["secretName"], item["key"]))
    assert secret_names == {("torchft-pg-job-secret", "job-secret")}
    recipe = (ROOT / "docs" / "operations.md").read_text()  # where the recipes are explained
    assert "kubectl create secret generic torchft-pg-job-secret --from-file=job-secret" in recipe


def test_k8s_each_pod_is_one_replica_group() -> None:
    job = manifests()["Job/torchft-pg-replica-groups"]
    spec = job["spec"]
    (trainer,) = spec["template"]["spec"]["containers"]
    env = env_of(trainer)
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["NUM_REPLICA_GROUPS"]["value"])
    assert env["REPLICA_GROUP_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    # The pod's own IP is what the other groups reach: its store and advertised address.
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["TORCHFT_HOSTNAME"]["value"] == "$(POD_IP)"
    assert trainer["command"][0] == "torchrun"
    assert "--master_addr=$(POD_IP)" in trainer["command"]
    # $(VAR) is expanded only from variables defined earlier in the list.
    names = [e["name"] for e in trainer["env"]]
    assert names.index("POD_IP") < names.index("TORCHFT_HOSTNAME")
    referenced = set(re.findall(r"\$\(([A-Z_]+)\)", " ".join(trainer["command"])))
    assert referenced <= set(names)


# --- torchx component ------------------------------------------------------------------


def test_torchx_linter_accepts_the_component() -> None:
    errors = lint_component(str(LAUNCH / "torchx_component.py"), "fault_tolerant_job")
    assert errors == []


def test_torchx_component_lighthouse_first_then_one_role_per_group() -> None:
    app = fault_tolerant_job(
        "--lr",
        "0.1",
        script="train.py",
        job_secret_file="/shared/secret",
        replica_groups=3,
        nproc_per_node=8,
        env={"STEPS": "7", "REPLICA_GROUP_ID": "ignored"},
    )
    assert [r.name for r in app.roles] == [LIGHTHOUSE_ROLE] + [
        replica_group_role_name(g) for g in range(3)
    ]
    lighthouse = app.roles[0]
    wrapper_args = lighthouse.args[lighthouse.args.index("--") + 1 :]
    flags = lighthouse_parser().parse_args(wrapper_args)
    assert flags.bind == "[::]:29510"
    assert flags.http_bind == "[::]:29511"
    assert flags.job_secret_file == "/shared/secret"
    assert flags.job_id == specs.macros.app_id
    assert lighthouse.port_map == {"grpc": 29510, "http": 29511}
    for group, role in enumerate(app.roles[1:]):
        assert role.env == {
            "STEPS": "7",
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": "3",
            "TORCHFT_JOB_SECRET_FILE": "/shared/secret",
            "TORCHFT_JOB_ID": specs.macros.app_id,
        }
        assert role.retry_policy == specs.RetryPolicy.REPLICA
        assert role.entrypoint == "bash"
        # What the shell sees once torchx has filled in its macros on the local scheduler.
        values = specs.macros.Values(
            img_root="", app_id="app-1", replica_id="0", rank0_env="TORCHX_RANK0_HOST"
        )
        command = values.apply(role).args[1]
        assert command == (
            'TORCHFT_LIGHTHOUSE="${TORCHX_RANK0_HOST:-localhost}:29510" exec torchrun '
            "--nnodes=1 --nproc_per_node=8 --standalone train.py --lr 0.1"
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replica_groups": 0}, "replica_groups must be >= 1, got 0"),
        ({"lighthouse_port": 70000}, "lighthouse_port must be in [1, 65535], got 70000"),
        ({"job_secret_file": " "}, "job_secret_file must name the job secret's file"),
        ({"max_retries": -1}, "max_retries must be >= 0, got -1"),
    ],
)
def test_torchx_component_names_bad_input(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"script": "train.py", "job_secret_file": "/s", **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        fault_tolerant_job(**args)


# --- lighthouse role: when it has served its job ---------------------------------------


def test_idle_watch_waits_for_a_join_then_for_a_quiet_stretch() -> None:
    watch = IdleWatch(IdleRule(exit_when_idle_s=10, first_join_timeout_s=0), started_s=0)
    assert watch.observe(now_s=1000, live_count=0) is Verdict.KEEP_SERVING  # nobody yet
    assert watch.observe(now_s=1001, live_count=2) is Verdict.KEEP_SERVING
    assert watch.observe(now_s=1002, live_count=0) is Verdict.KEEP_SERVING  # idle from 1002
    assert watch.observe(now_s=1011, live_count=None) is Verdict.KEEP_SERVING  # unreadable
    assert watch.observe(now_s=1011.5, live_count=1) is Verdict.KEEP_SERVING  # a restart
    assert watch.observe(now_s=1012, live_count=0) is Verdict.KEEP_SERVING  # idle from 1012
    assert watch.observe(now_s=1021.9, live_count=0) is Verdict.KEEP_SERVING
    assert watch.observe(now_s=1022, live_count=0) is Verdict.JOB_DONE


def test_a_job_that_joined_and_left_between_two_looks_is_done_after_the_idle_time() -> None:
    """Seen in the torchx test: both groups trained 5 steps and left within 0.6 s, between
    two 1 s polls; live_count was never seen above 0, but a quorum was issued."""
    watch = IdleWatch(IdleRule(exit_when_idle_s=1, first_join_timeout_s=0), started_s=0)
    assert watch.observe(now_s=10, live_count=0) is Verdict.KEEP_SERVING  # nobody yet
    assert watch.observe(now_s=11, live_count=0, quorums_issued=1) is Verdict.KEEP_SERVING
    assert watch.observe(now_s=12, live_count=0, quorums_issued=1) is Verdict.JOB_DONE


def test_idle_watch_gives_up_when_nobody_joins() -> None:
    watch = IdleWatch(IdleRule(exit_when_idle_s=5, first_join_timeout_s=60), started_s=100)
    assert watch.observe(now_s=159, live_count=0) is Verdict.KEEP_SERVING
    assert watch.observe(now_s=160, live_count=None) is Verdict.NOBODY_CAME


def test_idle_rule_and_status_url_name_bad_values() -> None:
    with pytest.raises(ValueError, match="exit_when_idle_s must be > 0 seconds, got 0"):
        IdleRule(exit_when_idle_s=0, first_join_timeout_s=0)
    with pytest.raises(ValueError, match="--http-bind none"):
        status_url("none")
    with pytest.raises(ValueError, match="must be host:port, got 'nowhere'"):
        status_url("nowhere")
    assert status_url("[::]:29511") == "http://localhost:29511/status"
    assert status_url("0.0.0.0:1") == "http://127.0.0.1:1/status"
    assert status_url("10.0.0.1:29511") == "http://10.0.0.1:29511/status"
