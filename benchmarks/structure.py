"""The structure of a checkout, measured from its imports: the folders of `train/` that import
each other in a circle, the pairs of folders that import each other, the modules of each folder
and the longest modules. Every import counts, at the top of a file, inside functions and under
TYPE_CHECKING (an import inside a function is a dependency all the same).

    python -m benchmarks.structure                 # this checkout
    python -m benchmarks.structure --repo DIR      # another one (e.g. an older commit's
                                                   # `git worktree add DIR <commit>`)

tests/test_layering.py uses the same walk to hold the library's and the program's layering
(the program's floors, top to bottom, are written there).
"""

from __future__ import annotations

import argparse
import ast
import collections
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
# A module longer than this does more than one job (the house's aim; STYLE.md aims at 300).
LONG_MODULE_LINES = 450


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


def folder_of(module: str, package_dir: Path) -> str:
    """The folder a module of `package_dir`'s package lies in ("train" for the commands at
    its top); a package's `__init__` is its own folder."""
    parts = module.split(".")
    if (package_dir.parent / Path(*parts)).is_dir():
        return module
    return ".".join(parts[:-1])


def folder_graph(package_dir: Path) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """(folder -> the folders it imports, folder -> its modules)."""
    graph = internal(import_graph(package_dir))
    folders: dict[str, set[str]] = collections.defaultdict(set)
    members: dict[str, list[str]] = collections.defaultdict(list)
    for module, imports in graph.items():
        source = folder_of(module, package_dir)
        members[source].append(module)
        folders[source] |= {folder_of(name, package_dir) for name in imports} - {source}
    return dict(folders), dict(members)


def report(repo: Path) -> str:
    package = repo / "train"
    folders, members = folder_graph(package)
    circles = find_cycles(folders)
    pairs = sorted(
        {
            tuple(sorted((a, b)))
            for a, targets in folders.items()
            for b in targets
            if a in folders.get(b, ())
        }
    )
    lines = [f"train/ of {repo}: {len(members)} folders, {sum(map(len, members.values()))} modules"]
    lines.append(
        f"circles between folders: {len(circles)}"
        + "".join(f"\n  {len(c.members)} folders, e.g. {' -> '.join(c.loop)}" for c in circles)
    )
    lines.append(
        f"folder pairs that import each other: {len(pairs)}"
        + ("\n  " + ", ".join(f"{a} <-> {b}" for a, b in pairs) if pairs else "")
    )
    lines.append(
        "modules per folder: "
        + ", ".join(
            f"{name.removeprefix('train.') or 'train'} {len(mods)}"
            for name, mods in sorted(members.items())
        )
    )
    sizes = sorted(
        (
            (len(path.read_text().splitlines()), path.relative_to(repo))
            for path in package.rglob("*.py")
        ),
        reverse=True,
    )
    over = [s for s in sizes if s[0] > LONG_MODULE_LINES]
    lines.append(
        f"modules over {LONG_MODULE_LINES} lines: {len(over)}; the longest: "
        + ", ".join(f"{path} {n}" for n, path in sizes[:8])
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT, help="a checkout's root")
    print(report(parser.parse_args().repo.resolve()))


if __name__ == "__main__":
    main()
