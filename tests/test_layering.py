"""The layering of the library and of the training program, read from the source with
`ast`: every import counts, at the top of a file and inside functions (an import inside a
function is a dependency all the same, and the circles it closes are the ones a top-of-file
reading misses).

    python -m pytest -q tests/test_layering.py

The helpers take a package root, so the same walk serves `train/`: `import_graph(path)` gives
each module's imports, `internal(graph)` the arrows between the package's own modules,
`by_part(graph)` the arrows between its sub-packages and top-level modules, and
`find_cycles(graph)` names the modules of every circle, one loop each.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "flax_transformer"


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `package_dir` (a package's own
    name stands for its `__init__.py`)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imported(node: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The dotted names one import statement brings in: `from X import a` is `X.a` where that
    is a module of the walked package, else `X`; relative imports resolved against `module`."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    names = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        names.add(submodule if submodule in modules else base)
    return names


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of the package under `package_dir` -> every dotted name it imports
    (top of file, inside functions, under `if TYPE_CHECKING:`; the package's own modules and
    other libraries alike). A parent package's `__init__` that Python runs on the way to a
    module is not an arrow: only what the code names."""
    files = module_names(package_dir)
    modules = set(files)
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[module] = set().union(
            *(
                _imported(node, module, is_package, modules)
                for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom)
            )
        )
    return graph


def internal(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between the graph's own modules (other libraries dropped, self-imports too)."""
    return {
        module: {name for name in imports if name in graph and name != module}
        for module, imports in graph.items()
    }


def part_of(module: str, depth: int = 1) -> str:
    """The sub-package or top-level module `module` belongs to: `flax_transformer.checks.tokens`
    -> `flax_transformer.checks` (depth 1); the package itself stays itself."""
    return ".".join(module.split(".")[: depth + 1])


def by_part(graph: dict[str, set[str]], depth: int = 1) -> dict[str, set[str]]:
    """The internal arrows between sub-packages and top-level modules (arrows inside one
    part dropped): a circle here is a circle between rooms, even where no two files close it."""
    parts: dict[str, set[str]] = {}
    for module, imports in internal(graph).items():
        source = part_of(module, depth)
        targets = {part_of(name, depth) for name in imports} - {source}
        parts.setdefault(source, set()).update(targets)
    return parts


class Circle(NamedTuple):
    """Nodes that import each other (a strongly connected part of the graph), and one loop
    `[a, b, ..., a]` through them: an arrow on it has to go for the circle to open."""

    members: list[str]
    loop: list[str]


def find_cycles(graph: dict[str, set[str]]) -> list[Circle]:
    """Every circle of `graph` (node -> the nodes it imports); [] when there is none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            members = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.add(member)
                if member == node:
                    break
            if len(members) > 1:
                circles.append(members)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [Circle(sorted(members), _loop(graph, members)) for members in circles]


def _loop(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A shortest path from the first member back to itself inside `members` (breadth-first)."""
    start = min(members)
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph.get(node, set()) & members):
                if succ == start:
                    path = [start]  # walked back from the end: start <- node <- ... <- start
                    while node is not None:
                        path.append(node)
                        node = came_from[node]
                    return path[::-1]
                if succ not in came_from:
                    came_from[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no loop through {sorted(members)}")  # a circle always has one


def describe(cycles: list[Circle]) -> str:
    """The circles for a failure message: their members, and one loop each."""
    return "; ".join(
        f"{len(c.members)} in a circle ({', '.join(c.members)}), e.g. {' -> '.join(c.loop)}"
        for c in cycles
    )


def reachable(graph: dict[str, set[str]], starts: list[str]) -> set[str]:
    """The internal modules `starts` import, directly or through others (starts included)."""
    seen, todo = set(starts), list(starts)
    while todo:
        for name in internal(graph)[todo.pop()]:
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


GRAPH = import_graph(LIBRARY)


def _inside(part: str) -> list[str]:
    return [m for m in GRAPH if m == part or m.startswith(part + ".")]


def test_the_walk_sees_imports_inside_functions_and_resolves_relative_ones(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub.b import g\n    return g\n")
    (package / "sub" / "b.py").write_text("from ..a import f\nimport numpy\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a", "numpy"}
    assert graph["pkg.sub"] == {"pkg.sub.b"}
    assert find_cycles(internal(graph)) == [
        Circle(["pkg.a", "pkg.sub.b"], ["pkg.a", "pkg.sub.b", "pkg.a"])
    ]
    assert find_cycles(by_part(graph)) == [
        Circle(["pkg.a", "pkg.sub"], ["pkg.a", "pkg.sub", "pkg.a"])
    ]
    assert find_cycles({"x": {"y"}, "y": set()}) == []


def test_no_circle_between_the_librarys_modules():
    cycles = find_cycles(internal(GRAPH))
    assert not cycles, f"import circles between modules: {describe(cycles)}"


def test_no_circle_between_the_librarys_sub_packages():
    """Rooms, not files: `checks/` importing `functional/` while `functional/` imports
    `checks/` is a circle even where no two files close it."""
    cycles = find_cycles(by_part(GRAPH))
    assert not cycles, f"import circles between sub-packages/modules: {describe(cycles)}"


def test_functional_reaches_no_flax():
    """`functional` never imports flax, nor through a module of the library it imports."""
    reached = reachable(GRAPH, _inside("flax_transformer.functional"))
    offenders = sorted(
        f"{m} imports {name}"
        for m in reached
        for name in GRAPH[m]
        if name == "flax" or name.startswith("flax.")
    )
    assert not offenders, offenders


def test_the_library_imports_nothing_of_train():
    offenders = sorted(
        f"{m} imports {name}"
        for m, imports in GRAPH.items()
        for name in imports
        if name == "train" or name.startswith("train.")
    )
    assert not offenders, offenders


@pytest.mark.parametrize(
    "part, below",
    [
        # The cache the models read and write is theirs; generation builds on the models.
        ("flax_transformer.decoding", ["flax_transformer.models", "flax_transformer.blocks"]),
        # The checks are the ground floor beside config: everything may use them.
        ("flax_transformer.functional", ["flax_transformer.checks"]),
    ],
)
def test_lower_floors_do_not_import_upper_ones(part, below):
    offenders = sorted(
        f"{m} imports {name}"
        for m in reachable(GRAPH, [n for lower in below for n in _inside(lower)])
        if m not in _inside(part)
        for name in internal(GRAPH)[m]
        if name in _inside(part)
    )
    assert not offenders, offenders


def test_the_cache_keeps_its_old_import_path():
    """`flax_transformer.decoding.cache` (the cache's place before it moved below the models)
    still names every function of `flax_transformer.cache`, the same objects."""
    from flax_transformer import cache
    from flax_transformer.decoding import cache as old_place

    public = [n for n, v in vars(cache).items() if callable(v) and v.__module__ == cache.__name__]
    public = [n for n in public if not n.startswith("_")]
    assert sorted(old_place.__all__) == sorted(public)
    assert all(getattr(old_place, n) is getattr(cache, n) for n in public)


# The training program: no circle between its modules (function-level imports counted), and
# the leaves it is built on stay leaves.
PROGRAM = import_graph(ROOT / "train")


def _inside_program(part: str) -> list[str]:
    return [m for m in PROGRAM if m == part or m.startswith(part + ".")]


def test_no_circle_between_the_programs_modules():
    cycles = find_cycles(internal(PROGRAM))
    assert not cycles, f"import circles between modules of train/: {describe(cycles)}"


@pytest.mark.parametrize(
    "leaf, above",
    [
        # What a pretrained source is: read by config/, data/, store/ and program/ alike.
        (
            "train.formats.sources",
            ["train.config", "train.data", "train.data.store", "train.program"],
        ),
        # The corpus table: the config's choices and the tasks' corpora derive from it.
        ("train.formats.corpora", ["train.config", "train.program", "train.data.store"]),
        # The optimizer table: config checks its sections, program builds from it.
        (
            "train.formats.optimizers",
            ["train.config", "train.data", "train.tasks", "train.program", "train.tools"],
        ),
    ],
)
def test_the_programs_leaves_import_nothing_above_them(leaf, above):
    offenders = sorted(
        f"{m} imports {name}"
        for m in reachable(PROGRAM, _inside_program(leaf))
        for name in internal(PROGRAM)[m]
        if any(name in _inside_program(part) for part in above)
    )
    assert not offenders, offenders


def test_the_config_sections_build_nothing():
    """`train/config/` holds checked, frozen data: optax and the decoding strategies are
    built in `train/program/` (`optim`, `inference`)."""
    offenders = sorted(
        f"{m} imports {name}"
        for m in _inside_program("train.config")
        for name in PROGRAM[m]
        if name == "optax" or name.startswith("optax.")
    )
    assert not offenders, offenders
