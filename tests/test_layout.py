"""The rooms' rules, checked on the source: one package name, no import circle, the
coordinator never imports in-rank code, nothing on a training node imports Ray, and
every module small enough to read in one sitting."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib
from repo_paths import REPO

#: Source folder -> installed package (pyproject's package-dir).
ROOTS = {REPO / "agent": "rankscope", REPO / "coordinator": "rankscope.coordinator"}
MAX_LINES = 400
IN_RANK = ("rankscope.probe", "rankscope.client", "rankscope.dump")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for root, pkg in ROOTS.items():
        for path in root.rglob("*.py"):
            if "_attach" in path.parts:
                continue  # a sitecustomize, not a module of the package
            rel = path.relative_to(root).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join((pkg, *rel))] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str) -> set[str]:
    """Every rankscope module ``path`` imports, at module level or inside functions,
    outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = name.split(".")[: len(name.split(".")) - child.level + (1 if is_pkg else 0)]
                    base = ".".join(parts + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names)
            visit(child)

    visit(tree)
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}


def test_pyproject_lists_every_package_folder():
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(doc["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert listed == on_disk, (sorted(listed - on_disk), sorted(on_disk - listed))
    assert doc["tool"]["setuptools"]["package-dir"] == {"rankscope": "agent", "rankscope.coordinator": "coordinator"}


def test_no_import_circle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(GRAPH[m]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = walk(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            cycle = walk(m)
            assert cycle is None, " -> ".join(cycle)


def test_the_coordinator_imports_no_in_rank_module():
    bad = {(m, dep) for m, deps in GRAPH.items() if m.startswith("rankscope.coordinator")
           for dep in deps if dep.startswith(IN_RANK)}
    assert not bad, sorted(bad)


#: Rooms every process shares (the wire, the config, files and texts) and the coordinator's
#: pure logic: none imports a process's room.
SHARED = ("rankscope.wire", "rankscope.config", "rankscope.files", "rankscope.text", "rankscope.coordinator.logic")


@pytest.mark.parametrize("room", SHARED)
def test_shared_and_pure_rooms_import_no_process_room(room):
    allowed = SHARED
    bad = {(m, dep) for m, deps in GRAPH.items() if m.startswith(room) for dep in deps
           if dep != "rankscope" and not dep.startswith(allowed)}
    assert not bad, sorted(bad)


def _third_party(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_nothing_on_a_training_node_imports_ray():
    bad = [m for m, p in MODULES.items() if not m.startswith("rankscope.coordinator") and "ray" in _third_party(p)]
    assert not bad, bad


def test_the_coordinator_logic_imports_neither_ray_nor_sockets():
    bad = [m for m, p in MODULES.items() if m.startswith("rankscope.coordinator.logic")
           and _third_party(p) & {"ray", "zmq"}]
    assert not bad, bad


def test_no_module_is_too_long_to_read_in_one_sitting():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_installed_name_is_rankscope_only(tmp_path):
    # A user's own agent.py must not shadow us: nothing generic is importable as ours.
    import importlib.util
    import subprocess
    import sys
    (tmp_path / "agent.py").write_text("raise SystemExit('the user agent.py was imported')\n")
    (tmp_path / "coordinator.py").write_text("raise SystemExit('the user coordinator.py was imported')\n")
    out = subprocess.run([sys.executable, "-c", "from rankscope import PrecisionDebugger, seed_all, MsprobeStep;"
                          "import rankscope.coordinator.logic.core; print('ok')"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert importlib.util.find_spec("rankscope") is not None


def test_tests_starting_ray_in_process_run_before_the_auth_less_helm_test():
    # Ray keeps a process's auth mode: once tests/deploy/test_helm.py has run a Ray without
    # auth in this pytest process, a private Ray started in-process afterwards fails its
    # GCS start. Pytest runs folders in name order, so such tests belong under tests/coordinator.
    tests = Path(__file__).resolve().parent
    late = [str(p.relative_to(tests)) for p in sorted(tests.rglob("test_*.py"))
            if "ray.init(" in p.read_text(encoding="utf-8")
            and str(p.relative_to(tests)) > "deploy" and p.name not in ("test_helm.py", "test_layout.py")]
    assert not late, f"in-process Ray after tests/deploy (move them under tests/coordinator): {late}"


def _folder_map() -> list[tuple[list[str], list[str], str]]:
    """The architecture page's folder map: per row, its folders, their import names, and
    what it says lives there."""
    import re
    rows = []
    for line in (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.match(r"`(agent|coordinator)/", cells[1]):
            rows.append((re.findall(r"`((?:agent|coordinator)/[\w/]*/)`", cells[1]),
                         re.findall(r"\(`(rankscope[\w.]*)`\)", cells[1]), cells[2]))
    return rows


def test_the_architecture_page_maps_every_package_folder_and_names_what_is_there():
    rows = _folder_map()
    mapped = [f for folders, _, _ in rows for f in folders]
    on_disk = {str(p.parent.relative_to(REPO)) + "/" for p in MODULES.values() if p.name == "__init__.py"}
    on_disk -= {"agent/", "coordinator/"}  # the two roots: the page's prose says what they are
    assert len(mapped) == len(set(mapped)), "a folder is mapped twice"
    assert set(mapped) == on_disk, (sorted(on_disk - set(mapped)), sorted(set(mapped) - on_disk))
    for folders, names, what in rows:
        for folder, name in zip(folders, names):
            root = "agent/" if folder.startswith("agent/") else "coordinator/"
            pkg = ROOTS[REPO / root.rstrip("/")]
            assert name == ".".join([pkg, *folder[len(root):].strip("/").split("/")]), (folder, name)
        import re
        for module in re.findall(r"`([\w*]+\.py)`", what):
            assert any(list((REPO / f).glob(module)) for f in folders), f"{module} is not in {folders}"
