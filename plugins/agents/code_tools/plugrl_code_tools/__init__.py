"""Tools that run the model's code: ``python`` (a local subprocess under kernel limits, alias
verl's ``code_interpreter``) and ``sandbox`` (a remote sandbox service with SandboxFusion's
``/run_code`` API, for real isolation)."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_tools(register):
    register(
        "python",
        "plugrl_code_tools.python:PythonTool",
        config="plugrl_code_tools.python:PythonToolConfig",
        description="runs Python in a local subprocess: CPU, memory, file and process limits, "
        "an empty folder, no network where the kernel allows",
        aliases=["code_interpreter"],
    )
    register(
        "sandbox",
        "plugrl_code_tools.sandbox:SandboxTool",
        config="plugrl_code_tools.sandbox:SandboxToolConfig",
        description="runs code in a remote sandbox service (SandboxFusion's /run_code API)",
    )
