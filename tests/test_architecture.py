"""The package's shape, checked: which layer imports which, no import
cycles, one settings list that the README documents exactly, and the wgpu
private members kem relies on (docs/architecture.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kem_port
from kem_port.config import SETTINGS, Config, settings_table

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kem_port"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions count)."""
    found: set[str] = set()
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def package_graph() -> dict[str, set[str]]:
    """kem_port's modules and the kem_port modules each one imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


BASICS = ("kem_port.__version__", "kem_port.errors", "kem_port.config", "kem_port.stats", "kem_port.kernel_store", "kem_port.gpu.wgsl")
# What each layer may import of kem_port (docs/architecture.md, "Layers"),
# most specific package first; the package docstrings say the same.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("kem_port.gpu.wgsl", ("kem_port.errors", "kem_port.gpu.wgsl")),
    ("kem_port.transfer", ("kem_port.errors", "kem_port.transfer")),
    ("kem_port.gpu", (*BASICS, "kem_port.transfer", "kem_port.gpu")),
    ("kem_port.arweave", (*BASICS, "kem_port.arweave")),
    ("kem_port.wire", (*BASICS, "kem_port.transfer", "kem_port.gpu", "kem_port.wire")),
    ("kem_port.admission", (*BASICS, "kem_port.transfer", "kem_port.gpu", "kem_port.wire", "kem_port.admission")),
    ("kem_port.port", (*BASICS, "kem_port.transfer", "kem_port.gpu", "kem_port.wire", "kem_port.admission",
                       "kem_port.arweave", "kem_port.port")),
]
NEVER = ("erlang",)  # erlang-py: only the wire layer reads terms


def layer_of(module: str) -> tuple[str, tuple[str, ...]] | None:
    return next(((name, allowed) for name, allowed in LAYERS if module == name or module.startswith(name + ".")), None)


def layer_breaches(root: Path = ROOT) -> list[str]:
    """Every import of a kem_port module, or of erlang-py below the wire, that its layer's rule does not allow."""
    found = []
    for path in sorted((root / "kem_port").rglob("*.py")):
        module = module_name(path, root)
        rule = layer_of(module)
        if rule is None:
            continue
        name, allowed = rule
        for imported in sorted(imports_of(path, root)):
            wire_or_above = name in ("kem_port.wire", "kem_port.admission", "kem_port.port")
            if imported.split(".")[0] in NEVER and not wire_or_above:
                found.append(f"{module} imports {imported}")
            elif imported.startswith("kem_port.") and not imported.startswith(allowed):
                found.append(f"{module} imports {imported}")
    return found


def test_each_layer_imports_only_the_layers_below_it():
    assert len(list((PACKAGE / "gpu").rglob("*.py"))) >= 30 and len(list((PACKAGE / "wire").glob("*.py"))) >= 8
    assert layer_breaches() == []


def test_a_planted_upward_import_is_found(tmp_path):
    """The check above can fail: imports against the direction, at any depth and relative, are found."""
    for package in ("gpu", "wire", "transfer", "port"):
        (tmp_path / "kem_port" / package).mkdir(parents=True)
    (tmp_path / "kem_port" / "gpu" / "planted.py").write_text(
        "def f():\n    from kem_port.wire.protocol import KernelCall\n    import erlang\n    from ..port import router\n")
    (tmp_path / "kem_port" / "wire" / "planted.py").write_text("from kem_port.port.intake import Intake\n")
    (tmp_path / "kem_port" / "transfer" / "planted.py").write_text("from kem_port.gpu.calls import Job\n")
    (tmp_path / "kem_port" / "port" / "fine.py").write_text("from kem_port.wire import terms\nimport erlang\n")
    assert layer_breaches(tmp_path) == [
        "kem_port.gpu.planted imports erlang",
        "kem_port.gpu.planted imports kem_port.port",
        "kem_port.gpu.planted imports kem_port.port.router",
        "kem_port.gpu.planted imports kem_port.wire.protocol",
        "kem_port.gpu.planted imports kem_port.wire.protocol.KernelCall",
        "kem_port.transfer.planted imports kem_port.gpu.calls",
        "kem_port.transfer.planted imports kem_port.gpu.calls.Job",
        "kem_port.wire.planted imports kem_port.port.intake",
        "kem_port.wire.planted imports kem_port.port.intake.Intake",
    ]


def test_the_top_level_keeps_a_handful_of_modules():
    """The package face, settings, errors, counters, kernel sources and the port client (issue 28: <= 12;
    the Python API is the kem_port/api/ package since issue 26)."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_of_kem_port_has_no_cycles():
    graph = package_graph()
    assert "kem_port.gpu.executor" in graph and "kem_port.port.router" in graph
    # A package imports its parent package implicitly; only edges between modules count.
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges) or [])}"
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_runtime_files_and_classes_stay_small():
    """One concern per file: no runtime file over ~300 lines, no class over ~200."""
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().count("\n")
        assert lines <= 300, f"{path.relative_to(ROOT)} has {lines} lines"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                assert size <= 200, f"class {node.name} in {path.name} has {size} lines"


def test_tools_are_not_in_the_runtime_package():
    for tool in ("fuzz", "echo", "echo_port", "seed_design"):
        assert not (PACKAGE / f"{tool}.py").exists()
    for script in ("fuzz.py", "echo_port.py", "seed_design.py"):
        assert (ROOT / "tools" / script).is_file()


def readme_settings() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_the_readme_documents_every_setting_and_no_other():
    documented = re.findall(r"^\| `(KEM_[A-Z0-9_]+)`", "\n".join(readme_settings()), re.M)
    assert sorted(documented) == sorted(s.env for s in SETTINGS)
    assert "\n".join(readme_settings()) == settings_table()


def test_each_setting_maps_to_one_config_field_and_kem_name():
    fields = set(Config.__dataclass_fields__)
    assert sorted(s.field for s in SETTINGS) == sorted(fields)
    for s in SETTINGS:
        assert s.env == "KEM_" + s.name.upper() and re.fullmatch(r"[a-z][a-z0-9_]*", s.name)
        assert getattr(Config(), s.field) == s.default
    assert "KEM_PORT_INDEX" not in {s.env for s in SETTINGS}


@pytest.mark.parametrize(
    "env, message",
    [
        ({"KEM_MAX_BATCH": "many"}, "KEM_MAX_BATCH='many' is not an integer"),
        ({"KEM_QUEUE_LIMIT": "0"}, "KEM_QUEUE_LIMIT='0' is below 1"),
        ({"KEM_VERIFY": "maybe"}, "KEM_VERIFY='maybe' is not one of strict, pinned, strict+pinned, off"),
        ({"KEM_GPU_TIMING": "sometimes"}, "KEM_GPU_TIMING='sometimes' is not one of auto, on, off"),
        ({"KEM_FETCH_TIMEOUT_MS": "0"}, "KEM_FETCH_TIMEOUT_MS='0' is below 1"),
        ({"KEM_LOG": "verbose"}, "KEM_LOG='verbose' is not a log level (debug, info, warning, error, critical)"),
    ],
)
def test_invalid_settings_stop_start_up_with_a_clear_message(env, message):
    with pytest.raises(SystemExit) as exc:
        Config.from_env(env)
    assert str(exc.value) == f"kem_port: {message}"


def test_settings_are_read_from_their_variables(tmp_path):
    config = Config.from_env({
        "KEM_MAX_BATCH": "8", "KEM_FETCH_TIMEOUT_MS": "1500", "KEM_GATEWAYS": "http://a, http://b",
        "KEM_TEST_HOOKS": "1", "KEM_POLL_SPIN_US": "0", "KEM_VERIFY": "Strict+Pinned", "KEM_SHM_DIR": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    })
    assert (config.max_batch, config.fetch_timeout_s, config.gateways) == (8, 1.5, ["http://a", "http://b"])
    assert (config.test_hooks, config.poll_spin_us, config.verify) == (True, 0, "strict+pinned")
    assert config.shm_dir == tmp_path.resolve() and config.cache_dir == tmp_path / "xdg" / "kem" / "kernels"
    blank = Config.from_env({"KEM_MAX_BATCH": " ", "KEM_GATEWAYS": ","})
    assert (blank.max_batch, blank.gateways, blank.poll_spin_us) == (64, ["https://arweave.net"], None)


def test_the_version_has_one_home():
    assert kem_port.__version__ == "0.2.0"
    sources = [p for p in PACKAGE.rglob("*.py") if re.search(r"\d+\.\d+\.\d+\"", p.read_text())]
    assert sources == [PACKAGE / "__init__.py"]
