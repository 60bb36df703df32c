"""deploy/: the cluster launcher config, the KubeRay RayJob and the tuning image parse, and what they run
is a real tunectl command whose spec validates."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.core.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE_ROOT = "/home/ray/tunectl/"  # where deploy/Dockerfile puts the repository


def check_tunectl_command(command: str) -> list[str]:
    """Parse ``command`` as the CLI would (unknown commands or options fail); check its --help runs."""
    args = shlex.split(command)
    assert args[0] == "tunectl", command
    if args[1:] == ["--help"]:
        assert CliRunner().invoke(app, ["--help"]).exit_code == 0
        return args
    cli: Any = typer.main.get_command(app)
    assert args[1] in cli.commands, f"no command tunectl {args[1]}"
    cli.commands[args[1]].make_context(args[1], args[2:])  # raises on an unknown option or a bad value
    helped = CliRunner().invoke(app, [args[1], "--help"])
    assert helped.exit_code == 0, helped.output
    return args


def check_specs_in(args: list[str]) -> None:
    """Specs the command names by their path in the image exist in this repository and validate."""
    specs = [a for a in args if a.startswith(IMAGE_ROOT) and a.endswith(".toml")]
    for spec in specs:
        load_spec(ROOT / spec.removeprefix(IMAGE_ROOT))


def test_the_rayjob_runs_a_real_tunectl_submit_whose_spec_validates() -> None:
    job = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    args = check_tunectl_command(job["spec"]["entrypoint"])
    assert args[1] == "submit" and "--results" in args
    check_specs_in(args)
    cluster = job["spec"]["rayClusterSpec"]
    gpus = [g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu") for g in
            cluster["workerGroupSpecs"]]  # fmt: skip
    assert all(gpus), "every worker group asks for GPUs"


def test_every_rayjob_container_gets_the_token_from_a_secret_never_inline() -> None:
    job = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    cluster = job["spec"]["rayClusterSpec"]
    templates = [job["spec"]["submitterPodTemplate"], cluster["headGroupSpec"]["template"]]
    templates += [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in templates:
        for container in template["spec"]["containers"]:
            env = {e["name"]: e for e in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert "value" not in env["RAY_AUTH_TOKEN"] and env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]


def test_the_cluster_launcher_config_is_valid_for_ray_and_runs_a_real_tunectl_submit() -> None:
    import jsonschema
    import ray.autoscaler

    config = yaml.safe_load((DEPLOY / "cluster.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    assert config["head_node_type"] in config["available_node_types"]
    args = check_tunectl_command(config["metadata"]["tunectl"]["submit"])
    assert args[1] == "submit"
    check_specs_in(args)
    for command in config["head_setup_commands"]:
        if command.startswith("tunectl"):
            check_tunectl_command(command.split(">")[0])
    assert all("RAY_AUTH_TOKEN=" not in c for c in config["head_start_ray_commands"]), "no token inline"


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_the_tuning_image_copies_every_package_and_runs_tunectl() -> None:
    instructions = _dockerfile()
    copied = {
        src for op, args in instructions if op == "COPY" for src in shlex.split(args)[:-1] if src[0] != "-"
    }
    for package in ("tunectl", "configs", "pyproject.toml"):
        assert package in copied and (ROOT / package).exists(), package
    (cmd,) = [json.loads(args) for op, args in instructions if op == "CMD"]
    check_tunectl_command(shlex.join(cmd))
    assert not any(op == "ENV" and "RAY_AUTH_TOKEN" in args for op, args in instructions), "no token baked in"


def documented_commands(text: str) -> list[str]:
    """tunectl commands shown in a file's comments (indented, as code), continuation lines joined."""
    commands, current = [], ""
    for line in text.splitlines():
        match = re.match(r"#\s{2,}(?:RAY_AUTH_MODE=\S+ )?(tunectl .*)$", line) if not current else None
        part = match.group(1) if match else (line.lstrip("# ").strip() if current else "")
        if not part:
            continue
        current = f"{current} {part}".strip()
        if current.endswith("\\"):
            current = current[:-1].strip()
            continue
        commands.append(current.split(" #")[0])
        current = ""
    return commands


@pytest.mark.parametrize("name", ["cluster.yaml", "rayjob.yaml", "Dockerfile"])
def test_every_tunectl_command_shown_in_the_comments_is_real(name: str) -> None:
    """The usage a file documents must keep working as the CLI changes."""
    commands = documented_commands((DEPLOY / name).read_text())
    assert commands or name == "Dockerfile"
    for command in commands:
        check_tunectl_command(command)
