"""The layering of the library and of the training program, read from the source with
`ast`: every import counts, at the top of a file and inside functions (an import inside a
function is a dependency all the same, and the circles it closes are the ones a top-of-file
reading misses).

    python -m pytest -q tests/test_layering.py

The walk is `benchmarks/structure.py`'s (`python -m benchmarks.structure` prints the same
graph's figures for a whole checkout): `import_graph(path)` gives each module's imports,
`internal(graph)` the arrows between the package's own modules, `by_part(graph)` the arrows
between its sub-packages and top-level modules, and `find_cycles(graph)` names the modules of
every circle, one loop each.
"""

from __future__ import annotations

import pytest

from benchmarks.structure import (
    ROOT,
    Circle,
    by_part,
    describe,
    find_cycles,
    import_graph,
    internal,
    reachable,
)

LIBRARY = ROOT / "flax_transformer"


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


# The program's floors, top to bottom (shared/DESIGN.md, "Layers of the house"): a module
# may import from its own room and from any room on a lower floor, never from a higher one
# or from another room of its own floor. The commands are the files at the top of train/.
FLOORS = [
    ["commands"],
    ["train.tools", "train.aot"],
    ["train.program"],
    ["train.tasks"],
    ["train.data"],  # train.data.store and train.data.chat are rooms inside it
    ["train.config"],
    # (train.formats itself is the package of the three, and holds no code)
    ["train.formats", "train.formats.corpora", "train.formats.sources", "train.formats.optimizers"],
    ["train.core"],
]
ROOMS = [room for floor in FLOORS for room in floor]


def room_of(module: str) -> str:
    """The room of a module of train/: the longest room name it lies in, else a command."""
    inside = [r for r in ROOMS if module == r or module.startswith(r + ".")]
    return max(inside, key=len) if inside else "commands"


def floor_of(room: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if room in floor)


def rooms_graph() -> dict[str, set[str]]:
    """Room -> the rooms its modules import (imports inside functions and under
    TYPE_CHECKING counted)."""
    graph: dict[str, set[str]] = {room: set() for room in ROOMS}
    for module, imports in internal(PROGRAM).items():
        source = room_of(module)
        graph[source] |= {room_of(name) for name in imports} - {source}
    return graph


def test_every_module_of_train_is_in_a_room():
    """A new folder of train/ is placed on a floor here before it is used."""
    folders = {
        ".".join(m.split(".")[:2])
        for m in PROGRAM
        if (ROOT / m.replace(".", "/")).is_dir() or m.count(".") >= 2
    }
    unplaced = sorted(f for f in folders if room_of(f) == "commands" and f != "train")
    assert not unplaced, f"folders of train/ on no floor of FLOORS: {unplaced}"


def test_no_circle_between_the_programs_rooms():
    cycles = find_cycles(rooms_graph())
    assert not cycles, f"import circles between folders of train/: {describe(cycles)}"


def test_imports_between_rooms_point_down():
    """Every import from one room to another goes to a lower floor: the arrows running back
    up (`program -> tools`, `data -> tasks`, `config -> data`, `formats -> config`, ...) are
    what made the loops."""
    offenders = sorted(
        f"{module} imports {name} ({room_of(module)} -> {room_of(name)})"
        for module, imports in internal(PROGRAM).items()
        for name in imports
        if room_of(name) != room_of(module) and floor_of(room_of(name)) <= floor_of(room_of(module))
    )
    assert not offenders, "\n".join(offenders)


def test_the_floors_catch_an_arrow_up(tmp_path):
    """The rule itself: a data module importing a task is an arrow up."""
    graph = {"train.data.x": {"train.tasks.y"}, "train.tasks.y": set()}
    assert floor_of(room_of("train.tasks.y")) < floor_of(room_of("train.data.x"))
    assert room_of("train.data.store.token_store") == "train.data"
    assert room_of("train.formats.sources.gguf") == "train.formats.sources"
    assert room_of("train.main") == "commands"
    assert find_cycles({"a": {"b"}, "b": {"a"}}) and not find_cycles(graph)
