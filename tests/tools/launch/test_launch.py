"""``plugrl launch``: the job files of the built-in launchers for every shipped recipe, each
checked by its scheduler's own rules: the RayJob against KubeRay's CRD schema, the SkyPilot
task against SkyPilot's schema (and by SkyPilot itself where it is installed), the sbatch
script by bash, against sbatch's options, and by ``sbatch --test-only`` on a private Slurm
controller where Slurm is installed. The two-node Ray run of a script is
tests/e2e/test_launch_slurm.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from plugrl.api import hookimpl
from plugrl.api.launch import Launcher, LaunchJob
from plugrl.errors import PlugrlError, RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import shipped_recipes
from plugrl_tools.cli import cli
from plugrl_tools.launch import job_name, prepare_launch, submit, write_job

FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = sorted(shipped_recipes())
NPU = sorted(f"recipes/npu/{path.name}" for path in Path("recipes/npu").glob("*.yaml"))
# every shipped recipe, with the device it is for
ALL = [(name, "cuda") for name in SHIPPED] + [(path, "npu") for path in NPU]
# what a user adds to a shipped recipe to launch it: the cluster's device, two nodes, the
# shared folder, and the options each scheduler needs
COMMON = [
    "device.name=cuda",
    "trainer.nnodes=2",
    "launch.workdir=/shared/team/grpo",
    "launch.venv=/shared/team/venv",
    "launch.network_interface=ib0",
    "launch.env={HF_HOME: /shared/hf, NCCL_DEBUG: WARN}",
]
SETTINGS = {
    "slurm": [
        "launch.launcher_args={partition: gpu, account: rl, time: '04:00:00', "
        "cpus_per_node: 64, memory: 500G}"
    ],
    "kuberay": [
        "launch.image=registry.example.com/plugrl:0.1",
        "launch.launcher_args={namespace: rl, volume_claim: shared-team}",
    ],
    "skypilot": ["launch.launcher_args={accelerators: H100, infra: aws, storage: 's3://team-rl'}"],
}


@pytest.fixture(scope="module")
def plugins():
    return get_plugin_manager()


def prepared(plugins, recipe: str, launcher: str, *extra: str):
    return prepare_launch(recipe, [*COMMON, *SETTINGS[launcher], *extra], launcher, plugins)


def rendered(plugins, recipe: str, launcher: str, *extra: str) -> str:
    launch = prepared(plugins, recipe, launcher, *extra)
    return launch.launcher.render(launch.job)


def nodes_of(plugins, recipe: str, *extra: str) -> int:
    """2 (trainer.nnodes), plus the engines' node in the recipes that give them their own."""
    return prepared(plugins, recipe, "slurm", *extra).job.nodes


def recipe_in(text: str, start: str) -> dict[str, Any]:
    """The recipe a job file writes (a here-document after ``start``)."""
    body = text.split(start, 1)[1].split("<<'PLUGRL_RECIPE_END'\n", 1)[1]
    return yaml.safe_load(body.split("\nPLUGRL_RECIPE_END", 1)[0])


# ------------------------------------------------------------------------------ the job


def test_the_job_comes_from_the_recipe_and_the_device(plugins):
    job = prepared(plugins, "gsm8k-grpo-qwen2.5-0.5b", "slurm").job
    assert (job.nodes, job.devices_per_node, job.device) == (2, 2, "cuda")
    assert (job.ray_resource, job.kubernetes_resource, job.slurm_gres) == (
        "GPU",
        "nvidia.com/gpu",
        "gpu",
    )
    # the device plugin names its collectives' variables; launch.env comes after them
    assert job.env == {
        "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_SOCKET_IFNAME": "ib0",
        "HF_HOME": "/shared/hf",
        "NCCL_DEBUG": "WARN",
    }
    assert job.name == "qwen2-5-0-5b-instruct"
    assert job.recipe_file == "launch/qwen2-5-0-5b-instruct.yaml"
    run = yaml.safe_load(job.recipe_text)
    # the recipe as written, relative paths kept (they start at the job's working folder)
    assert run["model"]["path"] == "models/Qwen2.5-0.5B-Instruct"
    assert run["trainer"]["nnodes"] == 2
    assert "launch" not in run


def test_engines_with_devices_of_their_own_add_their_nodes(plugins):
    job = prepared(
        plugins,
        "quickstart-async",
        "slurm",
        "trainer.n_gpus_per_node=4",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=8",
    ).job
    assert (job.nodes, job.devices_per_node) == (3, 8)
    job = prepared(plugins, "quickstart-async", "slurm", "launch.nodes=5").job
    assert job.nodes == 5


def test_an_npu_job_names_hccl_and_the_npu_resources(plugins):
    pytest.importorskip("plugrl_npu")
    npu_recipe = "recipes/npu/gsm8k-grpo-qwen2.5-0.5b-npu.yaml"
    job = prepared(plugins, npu_recipe, "slurm", "device.name=npu").job
    assert (job.ray_resource, job.kubernetes_resource, job.slurm_gres) == (
        "NPU",
        "huawei.com/Ascend910",
        "npu",
    )
    assert job.env["HCCL_SOCKET_IFNAME"] == "ib0"
    assert "NCCL_SOCKET_IFNAME" not in job.env
    assert job.ray_device_options() == [f'--resources={{"NPU": {job.devices_per_node}}}']


def test_ray_start_gives_each_node_its_devices():
    job = LaunchJob(
        name="j",
        nodes=2,
        devices_per_node=8,
        device="cuda",
        ray_resource="GPU",
        kubernetes_resource=None,
        slurm_gres=None,
        env={},
        network_interface=None,
        workdir="/shared/x y",
        venv=None,
        image=None,
        recipe_text="a: 1\n",
        recipe_file="launch/j.yaml",
        ray_port=6400,
        ray_args=("--num-cpus=32",),
    )
    assert job.head_start('"$ip"') == (
        'ray start --node-ip-address="$ip" --head --port=6400 --num-gpus=8 '
        "--disable-usage-stats --num-cpus=32 --block"
    )
    assert job.worker_start('"$ip"', block=False) == (
        'ray start --address="$ip":6400 --num-gpus=8 --disable-usage-stats --num-cpus=32'
    )
    assert job.driver("auto") == (
        "plugrl run --chdir='/shared/x y' launch/j.yaml cluster.mode=ray cluster.address=auto "
        "--wait-for-nodes=2 --wait-timeout=600"
    )


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["device.name=auto"], "device.name", "'auto' is detected where the run starts"),
        (["launch.launcher=~"], "launch.launcher", "needs a launcher"),
        (["launch.launcher=sge"], "launch.launcher", "unknown launcher 'sge'"),
        (["launch.launcher_args.partion=gpu"], "launch.launcher_args.partion", "partition"),
        (["launch.nodez=2"], "launch.nodez", "nodes"),
        (["launch.nodes=0"], "launch.nodes", ""),
    ],
)
def test_bad_launch_settings_are_refused_in_one_line(plugins, overrides, key, words):
    launcher = None if overrides[0].startswith("launch.launcher=") else "slurm"
    with pytest.raises(RecipeError) as error:
        prepare_launch(
            "gsm8k-grpo-qwen2.5-0.5b", ["device.name=cuda", *overrides], launcher, plugins
        )
    message = str(error.value)
    assert message.startswith(f"{key}:") and words in message and "\n" not in message


@pytest.mark.parametrize(
    ("launcher", "overrides", "key"),
    [
        ("kuberay", ["launch.image=~"], "launch.image"),
        ("kuberay", ["launch.workdir=~"], "launch.workdir"),
        ("kuberay", ["launch.launcher_args.volume_claim=~"], "launch.launcher_args.volume_claim"),
        ("kuberay", ["launch.workdir=/shared/a;b"], "launch.workdir"),
        ("kuberay", ["launch.ray_args=[--block]"], "launch.ray_args"),
        ("skypilot", ["launch.workdir=~"], "launch.workdir"),
        ("skypilot", ["launch.launcher_args.accelerators=~"], "launch.launcher_args.accelerators"),
        ("slurm", ["launch.launcher_args.sbatch_options=[exclusive]"], None),
    ],
)
def test_what_a_scheduler_cannot_run_is_refused_naming_the_key(plugins, launcher, overrides, key):
    with pytest.raises(RecipeError) as error:
        rendered(plugins, "gsm8k-grpo-qwen2.5-0.5b", launcher, *overrides)
    assert str(error.value).startswith(f"{key or 'launch.launcher_args.sbatch_options'}:")


def test_job_names_suit_every_scheduler():
    assert job_name("Qwen2.5_0.5B Instruct") == "qwen2-5-0-5b-instruct"
    assert job_name("7b-run") == "plugrl-7b-run"
    assert job_name("___") == "plugrl"
    assert len(job_name("x" * 100)) == 52


# ------------------------------------------------------------------------------ slurm

SBATCH_OPTIONS = {
    line
    for line in (FIXTURES / "sbatch-options.txt").read_text().splitlines()
    if line and not line.startswith("#")
}


def sbatch_option_problems(text: str) -> list[str]:
    """Each ``#SBATCH`` line checked against sbatch's long options: known, and given a value
    exactly where the option takes one."""
    problems = []
    for line in re.findall(r"^#SBATCH (.*)$", text, re.M):
        match = re.fullmatch(r"--([a-z][a-z0-9-]*)(=.+)?", line)
        if not match:
            problems.append(f"{line!r} is not a long option")
            continue
        name, value = match.groups()
        forms = {f"{name}=", f"{name}[=]"} if value else {name, f"{name}[=]"}
        if not forms & SBATCH_OPTIONS:
            problems.append(f"{line!r}: sbatch has no such option (or not in this form)")
    return problems


@pytest.mark.parametrize(("recipe", "device"), ALL)
def test_the_sbatch_script_of_each_shipped_recipe_is_valid(plugins, recipe, device, tmp_path):
    text = rendered(plugins, recipe, "slurm", f"device.name={device}")
    assert not sbatch_option_problems(text)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(
            ["shellcheck", "--severity=warning", str(script)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout
    nodes = nodes_of(plugins, recipe, f"device.name={device}")
    gres = {"cuda": "gpu", "npu": "npu"}[device]
    assert f"#SBATCH --nodes={nodes}" in text and f"#SBATCH --gres={gres}:" in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --chdir=/shared/team/grpo" in text
    network = {"cuda": "NCCL_SOCKET_IFNAME", "npu": "HCCL_SOCKET_IFNAME"}[device]
    assert f"export {network}=ib0" in text
    assert "source /shared/team/venv/bin/activate" in text
    assert recipe_in(text, "cat > ")["device"]["name"] == device


def test_the_option_check_finds_what_sbatch_refuses():
    assert sbatch_option_problems("#SBATCH --nodes=2\n#SBATCH --exclusive\n") == []
    assert len(sbatch_option_problems("#SBATCH --exclusve\n#SBATCH --nodes\n#SBATCH -N 2")) == 3


@pytest.fixture(scope="module")
def slurm_controller(tmp_path_factory):
    """A Slurm controller of this test's own (no slurmd): 16 nodes of 16 GPUs and 16 NPUs as
    cloud nodes,
    which ``sbatch --test-only`` schedules as if they were up. Skipped where Slurm is not
    installed."""
    if not (shutil.which("slurmctld") and shutil.which("sbatch")):
        pytest.skip("Slurm is not installed here (apt-get install slurm-wlm)")
    folder = tmp_path_factory.mktemp("slurm")
    conf = folder / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=plugrltest",
                "SlurmctldHost=localhost",
                "AuthType=auth/none",
                "CredType=cred/none",
                f"SlurmctldPort={_free_port()}",
                f"StateSaveLocation={folder}",
                f"SlurmdSpoolDir={folder}",
                f"SlurmctldPidFile={folder}/slurmctld.pid",
                f"SlurmctldLogFile={folder}/slurmctld.log",
                "SlurmUser=root",
                "ProctrackType=proctrack/linuxproc",
                "SelectType=select/cons_tres",
                "GresTypes=gpu,npu",
                "SuspendProgram=/bin/true",
                "ResumeProgram=/bin/true",
                "NodeName=node[1-16] NodeAddr=127.0.0.1 CPUs=64 RealMemory=512000 "
                "Gres=gpu:16,npu:16 State=CLOUD",
                "PartitionName=gpu Nodes=node[1-16] Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/sbin:/usr/bin:/bin"}
    controller = subprocess.Popen(
        ["slurmctld", "-D", "-f", str(conf)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["sinfo"], env=env, capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the Slurm controller did not start"
            time.sleep(0.2)
        yield env
    finally:
        controller.terminate()
        controller.wait(timeout=30)


@pytest.mark.parametrize(("recipe", "device"), ALL)
def test_slurm_would_schedule_the_sbatch_script(
    plugins, recipe, device, slurm_controller, tmp_path
):
    script = tmp_path / "job.sbatch"
    here = ["launch.launcher_args.account=~", "launch.workdir=~", f"device.name={device}"]
    script.write_text(rendered(plugins, recipe, "slurm", *here))
    result = subprocess.run(
        ["sbatch", "--test-only", str(script)], env=slurm_controller, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    nodes = nodes_of(plugins, recipe, f"device.name={device}")
    where = f"on nodes node[1-{nodes}]" if nodes > 1 else "on nodes node1"
    assert "to start at" in result.stderr and where in result.stderr


def test_slurm_refuses_a_script_asking_for_more_than_it_has(plugins, slurm_controller, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(
        rendered(
            plugins,
            "gsm8k-grpo-qwen2.5-0.5b",
            "slurm",
            "trainer.n_gpus_per_node=32",
            "launch.launcher_args.account=~",
            "launch.workdir=~",
        )
    )
    result = subprocess.run(
        ["sbatch", "--test-only", str(script)], env=slurm_controller, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "Requested node configuration is not available" in result.stderr


# ------------------------------------------------------------------------------ kuberay


def strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused, as ``kubectl create`` refuses them (its field
    validation is strict), except where the schema keeps unknown fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def rayjob_validator():
    import jsonschema

    schema = json.loads((FIXTURES / "rayjob-v1.schema.json").read_text())
    schema.pop("$comment")
    return jsonschema.Draft7Validator(strict(schema))


KUBERNETES_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.mark.parametrize(("recipe", "device"), ALL)
def test_the_rayjob_of_each_shipped_recipe_fits_the_crd(plugins, recipe, device, rayjob_validator):
    chosen = f"device.name={device}"
    config_map, ray_job = yaml.safe_load_all(rendered(plugins, recipe, "kuberay", chosen))
    nodes = nodes_of(plugins, recipe, chosen)
    errors = [
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in rayjob_validator.iter_errors(ray_job)
    ]
    assert not errors, "\n".join(errors[:10])
    assert (ray_job["apiVersion"], ray_job["kind"]) == ("ray.io/v1", "RayJob")
    for document in (config_map, ray_job):
        assert KUBERNETES_NAME.match(document["metadata"]["name"])
        assert len(document["metadata"]["name"]) <= 63
        assert document["metadata"]["namespace"] == "rl"
    assert (config_map["apiVersion"], config_map["kind"]) == ("v1", "ConfigMap")
    assert yaml.safe_load(config_map["data"]["recipe.yaml"])["device"]["name"] == device
    spec = ray_job["spec"]
    assert spec["entrypoint"].startswith(
        "plugrl run --chdir=/shared/team/grpo /etc/plugrl/recipe.yaml cluster.mode=ray "
        f"cluster.address=auto --wait-for-nodes={nodes}"
    )
    cluster = spec["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]]
    if nodes > 1:
        (workers,) = cluster["workerGroupSpecs"]
        assert workers["replicas"] == nodes - 1  # the head is the first node
        pods.append(workers)
    else:
        assert "workerGroupSpecs" not in cluster
    resource, network = {
        "cuda": ("nvidia.com/gpu", "NCCL_SOCKET_IFNAME"),
        "npu": ("huawei.com/Ascend910", "HCCL_SOCKET_IFNAME"),
    }[device]
    for group in pods:
        if device == "npu":  # Ray finds GPUs in a pod's limits, not NPUs
            assert group["rayStartParams"]["resources"].startswith('"{\\"NPU\\": ')
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] == "registry.example.com/plugrl:0.1"
        assert container["resources"]["limits"][resource] >= 1
        env = {item["name"]: item["value"] for item in container["env"]}
        assert env[network] == "ib0"
        assert env["PATH"].startswith("/shared/team/venv/bin:")
        assert {"name": "shared", "mountPath": "/shared/team/grpo"} in container["volumeMounts"]


def test_the_crd_check_finds_what_kubernetes_refuses(plugins, rayjob_validator):
    _, ray_job = yaml.safe_load_all(rendered(plugins, "quickstart", "kuberay"))
    ray_job["spec"]["rayClusterSpec"]["headGroupSpec"]["templat"] = {}
    ray_job["spec"]["shutdownAfterJobFinishes"] = "yes"
    del ray_job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    messages = [error.message for error in rayjob_validator.iter_errors(ray_job)]
    assert len(messages) == 3, messages


# ------------------------------------------------------------------------------ skypilot


@pytest.fixture(scope="module")
def skypilot_validators():
    import jsonschema

    schemas = json.loads((FIXTURES / "skypilot-task.schema.json").read_text())
    return (
        jsonschema.Draft7Validator(schemas["task"]),
        jsonschema.Draft7Validator(schemas["resources"]),
    )


def skypilot_problems(task: dict[str, Any], validators) -> list[str]:
    task_schema, resources_schema = validators
    return [error.message for error in task_schema.iter_errors(task)] + [
        error.message for error in resources_schema.iter_errors(task.get("resources", {}))
    ]


@pytest.mark.parametrize("recipe", SHIPPED)
def test_the_skypilot_task_of_each_shipped_recipe_fits_its_schema(
    plugins, recipe, skypilot_validators, tmp_path
):
    text = rendered(plugins, recipe, "skypilot")
    task = yaml.safe_load(text)
    assert not skypilot_problems(task, skypilot_validators)
    assert task["num_nodes"] == nodes_of(plugins, recipe)
    assert task["resources"]["accelerators"].startswith("H100:")
    assert task["file_mounts"] == {"/shared/team/grpo": {"source": "s3://team-rl", "mode": "MOUNT"}}
    assert task["envs"]["NCCL_SOCKET_IFNAME"] == "ib0"
    script = tmp_path / "run.sh"
    script.write_text(task["run"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert recipe_in(task["run"], "cat > ")["trainer"]["nnodes"] == 2


def test_the_skypilot_check_finds_what_skypilot_refuses(plugins, skypilot_validators):
    task = yaml.safe_load(rendered(plugins, "quickstart", "skypilot"))
    task["num_node"] = 2
    task["resources"]["use_spot"] = "sometimes"
    assert len(skypilot_problems(task, skypilot_validators)) == 2


def test_skypilot_reads_the_task(plugins, tmp_path):
    """SkyPilot's own reader, where it is installed (it is not a test dependency: it is large,
    and its schema above is checked everywhere)."""
    sky = pytest.importorskip("sky")
    path = tmp_path / "task.sky.yaml"
    path.write_text(rendered(plugins, "gsm8k-grpo-qwen2.5-0.5b", "skypilot"))
    task = sky.Task.from_yaml(str(path))
    assert task.num_nodes == 2


# ------------------------------------------------------------------------------ the command


class QueueLauncher(Launcher):
    """A launcher of another scheduler, as a plugin adds one: one job line per node."""

    name = "queue"
    file_suffix = ".queue"

    def render(self, job: LaunchJob) -> str:
        return "\n".join(
            [f"node 0: {job.head_start('$HEAD')}"]
            + [f"node {rank}: {job.worker_start('$HEAD')}" for rank in range(1, job.nodes)]
            + [f"run: {job.driver('$HEAD:6379')}", ""]
        )

    def submit_command(self, path: str) -> list[str]:
        return ["qsub", path]


@hookimpl
def register_launchers(register):
    register("queue", QueueLauncher)


def test_a_plugin_adds_a_launcher(plugrl_plugin_manager, plugrl_register_plugin, tmp_path):
    plugrl_register_plugin(sys.modules[__name__], "queue-launcher")
    launch = prepare_launch("quickstart", ["trainer.nnodes=4"], "queue", plugrl_plugin_manager)
    assert launch.default_file == "grpo-arithmetic.queue"  # trainer.experiment_name
    lines = launch.launcher.render(launch.job).splitlines()
    assert [line.partition(":")[0] for line in lines] == [*(f"node {i}" for i in range(4)), "run"]
    # the cpu device: ranks are placed by CPU, so ray start names no devices
    assert lines[1] == "node 1: ray start --address=$HEAD:6379 --disable-usage-stats --block"
    with pytest.raises(RecipeError, match=r"^launch.launcher_args: 'queue' takes no options"):
        prepare_launch("quickstart", ["launch.launcher_args.x=1"], "queue", plugrl_plugin_manager)


def test_the_command_writes_the_job_and_names_how_to_submit_it(tmp_path):
    result = CliRunner().invoke(
        cli,
        [
            *("launch", "gsm8k-grpo-qwen2.5-0.5b", "--kuberay", "--dry-run"),
            *(*COMMON, *SETTINGS["kuberay"], "-o", str(tmp_path / "job.yaml")),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"submit it with: kubectl create -f {tmp_path / 'job.yaml'}" in result.output
    assert len(list(yaml.safe_load_all((tmp_path / "job.yaml").read_text()))) == 2


def test_two_launchers_at_once_are_refused(tmp_path):
    result = CliRunner().invoke(
        cli, ["launch", "quickstart", "--slurm", "--launcher", "skypilot", "--dry-run"]
    )
    assert result.exit_code == 2 and "name two launchers" in result.output


def test_submitting_runs_the_schedulers_command(plugins, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(
        f'#!{sys.executable}\nimport sys\nprint("Submitted batch job 42", sys.argv[1:])\n'
    )
    fake.chmod(0o755)
    launch = prepared(plugins, "quickstart", "slurm")
    path = tmp_path / "job.sbatch"
    write_job(launch, path)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert submit(launch, path) == f"Submitted batch job 42 ['{path}']\n"
    fake.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 1\n")
    with pytest.raises(PlugrlError, match=r"exit 1\): sbatch: error: invalid partition$"):
        submit(launch, path)
    fake.unlink()
    with pytest.raises(PlugrlError, match=r"^sbatch is not on PATH: .* add --dry-run"):
        submit(launch, path)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def test_waiting_for_nodes_needs_a_ray_cluster_to_join(tmp_path, monkeypatch):
    (tmp_path / "recipe.yaml").write_text("cluster: local\n")
    # --chdir changes this process's folder: monkeypatch gives the test's back afterwards (Ray
    # sessions started later in this process put their driver's folder on the workers' path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli, ["run", "--chdir", str(tmp_path), "recipe.yaml", "--wait-for-nodes=2"]
    )
    assert result.exit_code == 2
    assert "--wait-for-nodes waits for the Ray cluster the run joins" in result.output


def test_a_launched_run_resumes_from_the_recipe_it_was_launched_from(plugins):
    """The job's run records its recipe without ``launch``; resumed with the user's recipe,
    which has it, the run is the same experiment."""
    from plugrl.recipe import build_recipe
    from plugrl.run.folder import recipe_changes

    launched = yaml.safe_load(prepared(plugins, "quickstart", "slurm").job.recipe_text)
    launched["cluster"] = {"mode": "ray"}  # as the job runs it
    recorded = build_recipe(launched, plugins).to_dict()
    resumed = build_recipe(
        {**launched, "launch": {"launcher": "slurm", "workdir": "/shared/x", "nodes": 4}},
        plugins,
    ).to_dict()
    assert recorded["launch"] != resumed["launch"]
    assert recipe_changes(recorded, resumed) == []
