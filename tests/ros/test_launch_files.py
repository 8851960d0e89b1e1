"""Launch files and parameter YAML checked without ROS launch installed (static, via ast).

Every node's package/executable must be a console script in setup.py,
every launch argument used must be declared (with a description), every share-relative file
must exist, and every parameter a launch file sets must exist in the node's YAML defaults.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedepth_ros.params import NODE_CONFIG, NODE_PARAMETERS

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))


def _package_name() -> str:
    match = re.search(r"<name>(.+?)</name>", (ROOT / "package.xml").read_text())
    assert match, "package.xml has no <name>"
    return match.group(1)


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entry_points = ast.literal_eval(node.value)
            return dict(s.split(" = ", 1) for s in entry_points["console_scripts"])
    raise AssertionError("setup.py has no entry_points")


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _str(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@dataclass
class LaunchModel:
    """What a launch file declares and uses, read from its syntax tree."""

    path: Path
    nodes: list[ast.Call] = field(default_factory=list)
    processes: list[ast.Call] = field(default_factory=list)
    declared: dict[str, ast.Call] = field(default_factory=dict)
    used_configs: set[str] = field(default_factory=set)
    share_paths: list[tuple[str, ...]] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)
    has_generate: bool = False

    @classmethod
    def parse(cls, path: Path) -> LaunchModel:
        tree = ast.parse(path.read_text(), filename=str(path))
        model = cls(path)
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        model.constants[target.id] = stmt.value.value
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "generate_launch_description":
                model.has_generate = True
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = _name(node.func)
            if fn == "Node":
                model.nodes.append(node)
            elif fn == "ExecuteProcess":
                model.processes.append(node)
            elif fn == "DeclareLaunchArgument":
                arg = _str(node.args[0]) if node.args else None
                assert arg, f"{path.name}: DeclareLaunchArgument without a literal name"
                model.declared[arg] = node
            elif fn == "LaunchConfiguration":
                arg = _str(node.args[0]) if node.args else None
                assert arg, f"{path.name}: LaunchConfiguration without a literal name"
                model.used_configs.add(arg)
            elif fn == "PathJoinSubstitution" and node.args:
                parts = node.args[0]
                if isinstance(parts, ast.List):
                    model.share_paths.append(
                        tuple(s for e in parts.elts if (s := _str(e)) is not None)
                    )
        return model

    def value(self, node: ast.expr | None) -> Any:
        """A literal, or a module constant referenced by name."""
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return _str(node)


MODELS = {p.name: LaunchModel.parse(p) for p in LAUNCH_FILES}


def test_the_launch_files_exist() -> None:
    assert set(MODELS) == {
        "robot.launch.py",
        "coordinator.launch.py",
        "replay.launch.py",
        "fleet_replay.launch.py",
    }
    for model in MODELS.values():
        assert model.has_generate, f"{model.path.name}: no generate_launch_description()"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_nodes_and_processes_name_known_executables(name: str) -> None:
    model = MODELS[name]
    known = set(_console_scripts())
    for call in model.nodes:
        package, executable = (
            model.value(_kw(call, "package")),
            model.value(_kw(call, "executable")),
        )
        assert package == _package_name(), f"{name}: Node package {package!r}"
        assert executable in known, f"{name}: Node executable {executable!r} is unknown"
        assert model.value(_kw(call, "name")) == executable, f"{name}: node name != executable"
    for call in model.processes:
        cmd = _kw(call, "cmd")
        assert isinstance(cmd, ast.List) and cmd.elts, f"{name}: ExecuteProcess without cmd list"
        first = cmd.elts[0]
        # the package's installed executable, never one found on PATH (FindExecutable)
        assert isinstance(first, ast.Call) and _name(first.func) == "PathJoinSubstitution", (
            f"{name}: ExecuteProcess must run <package prefix>/lib/<package>/<executable>"
        )
        parts = first.args[0]
        assert isinstance(parts, ast.List) and len(parts.elts) == 4
        prefix, lib, package, exe_node = parts.elts
        assert isinstance(prefix, ast.Call) and _name(prefix.func) == "FindPackagePrefix"
        assert model.value(prefix.args[0]) == _package_name()
        assert (_str(lib), model.value(package)) == ("lib", _package_name())
        exe = model.value(exe_node)
        assert exe in known, f"{name}: ExecuteProcess runs unknown executable {exe!r}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_launch_arguments_are_declared_and_described(name: str) -> None:
    model = MODELS[name]
    undeclared = model.used_configs - set(model.declared)
    assert not undeclared, f"{name}: LaunchConfiguration of undeclared {sorted(undeclared)}"
    unused = set(model.declared) - model.used_configs
    assert not unused, f"{name}: declared but unused launch arguments {sorted(unused)}"
    for arg, call in model.declared.items():
        assert _str(_kw(call, "description")), f"{name}: argument {arg!r} has no description"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_share_files_exist(name: str) -> None:
    for parts in MODELS[name].share_paths:
        if not parts or parts[0] == "lib":
            continue  # an installed executable (test_colcon_install resolves those)
        if parts[0] == "config" and len(parts) == 2:
            assert (ROOT / "config" / parts[1]).is_file(), (
                f"{name}: config/{parts[1]} does not exist"
            )
        elif parts[0] == "launch" and len(parts) == 2:
            assert (ROOT / "launch" / parts[1]).is_file(), f"{name}: launch/{parts[1]} missing"
        else:
            assert parts == (".fedepth", "coordinator"), f"{name}: unexpected path {parts}"


def _yaml_parameters(file: str, node: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "config" / file).read_text())
    key = f"/**/{node}"
    assert list(doc) == [key], f"config/{file}: top-level key must be {key!r} (any namespace)"
    params = doc[key]["ros__parameters"]
    assert isinstance(params, dict) and params
    return params


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_overrides_exist_in_the_yaml_defaults(name: str) -> None:
    model = MODELS[name]
    for call in model.nodes:
        executable = model.value(_kw(call, "executable"))
        defaults = _yaml_parameters(NODE_CONFIG[executable], executable)
        params = _kw(call, "parameters")
        assert isinstance(params, ast.List)
        for item in params.elts:
            if isinstance(item, ast.Dict):
                keys = {_str(k) for k in item.keys if k is not None}
                assert keys <= set(defaults), (
                    f"{name}: {executable} overrides unknown parameters "
                    f"{sorted(str(k) for k in keys - set(defaults))}"
                )


def test_every_config_file_is_used() -> None:
    referenced = {p[1] for m in MODELS.values() for p in m.share_paths if p[:1] == ("config",)}
    present = {p.name for p in (ROOT / "config").glob("*.yaml")}
    assert present <= referenced, present - referenced


@pytest.mark.parametrize("node", sorted(NODE_PARAMETERS))
def test_yaml_defaults_match_the_declared_parameters(node: str) -> None:
    params = _yaml_parameters(NODE_CONFIG[node], node)
    spec = NODE_PARAMETERS[node]
    assert set(params) == set(spec), f"{NODE_CONFIG[node]} vs fedepth_ros.params"
    for name, (default, description) in spec.items():
        assert description, f"{node}.{name} has no description"
        # ROS refuses a YAML value whose type differs from the declared one (10 vs 10.0)
        assert type(params[name]) is type(default), f"{node}.{name}: {params[name]!r}"
        assert params[name] == default, f"{node}.{name}: {params[name]!r} != {default!r}"


def test_console_scripts_point_at_modules_with_main() -> None:
    scripts = _console_scripts()
    assert {"robot_node", "depth_node", "bag_player", "fedepth-coordinator"} <= set(scripts)
    for exe, target in scripts.items():
        module = target.split(":")[0]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{exe} -> {target}"
