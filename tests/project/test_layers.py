"""The layers of the house, checked from the source text (ast), so that anyone can see them with
`pytest tests/project/test_layers.py -q`:

    frontends/        the CLI and the SQL functions (above everything)
    adapters/         one package or module per store (speaks to its store and to the core)
    topk_middleware/  the core: access model, noise, mechanisms, privacy, accounting, planner

A package may import from the layers below it, never from one above; no module imports itself
back through a circle of imports (imports inside functions count too); a module over
MAX_LINES lines (benchmarks/ included) says why in its docstring (a paragraph starting "Size:").

The core imports no store driver (STORE_DRIVERS). It names a module of a layer above in one
place only, declared in LATE_BINDINGS: `PrivacyLedger(url)` opens the SQL ledger store of
adapters/ledger.py, imported by name when a URL is first given (topk_middleware/ledger.py,
SQL_STORE). Any other string in the core that names a module above ("adapters.x", "frontends.x",
with or without ":name") fails the check, and so does a declared one that is gone.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("topk_middleware", "adapters", "frontends")  # bottom to top
ABOVE_ALL = ("benchmarks", "tests")
MAX_LINES = 600
SIZED = (*LAYERS, "benchmarks")  # the packages the size rule reads
STORE_DRIVERS = ("sqlalchemy", "duckdb", "psycopg", "psycopg2", "pyspark", "pymysql")
# (core module, the "module:name" it imports by name on first use): the only upward references.
LATE_BINDINGS = {("topk_middleware.ledger", "adapters.ledger:SQLLedgerStore")}
UPWARD_NAME = re.compile(r"^(?:adapters|frontends)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?$")


def project_modules(packages: tuple[str, ...] = LAYERS) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _nodes(tree: ast.AST, module_level: bool) -> list[ast.AST]:
    """Every node of the tree, or (module_level) those outside functions and classes."""
    if not module_level:
        return list(ast.walk(tree))
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
    return out


def imported_names(
    path: Path, module: str, module_level: bool = False, tree: ast.AST | None = None
) -> set[str]:
    """Every module this file imports, anywhere in it (relative imports resolved), or only
    those imported when the module is (`module_level`); `tree`: the file's parsed source,
    edited by the caller."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    if tree is None:
        tree = ast.parse(path.read_text(), str(path))
    for node in _nodes(tree, module_level):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def project_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module):
            # the longest project module that `name` is or lies inside
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                candidate = ".".join(parts[:cut])
                if candidate in modules:
                    if candidate != module:
                        targets.add(candidate)
                    break
        graph[module] = targets
    for module, binding in LATE_BINDINGS:  # a name imported later is an edge all the same
        graph[module].add(binding.partition(":")[0])
    return graph


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_no_layer_imports_a_layer_above_it() -> None:
    modules = project_modules()
    upward = []
    for module, path in modules.items():
        for name in imported_names(path, module):
            top = name.split(".")[0]
            if top in ABOVE_ALL or (top in LAYERS and LAYERS.index(top) > layer_of(module)):
                upward.append(f"{module} imports {name}")
    assert upward == [], "imports that run up the layers:\n" + "\n".join(sorted(upward))


def test_no_circle_of_imports() -> None:
    graph = project_graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            # a package's own modules may import the package's __init__ names only through
            # their real modules; importing the parent package itself is not an edge back
            if node.startswith(target + "."):
                continue
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert circles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an import of an adapter inside a core function is found."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from adapters.duckdb import DuckDBTable\n    return 1\n")
    assert "adapters.duckdb.DuckDBTable" in imported_names(source, "topk_middleware.probe")
    relative = tmp_path / "rel.py"
    relative.write_text("from ..access import Rows\n")
    assert "topk_middleware.access" in imported_names(relative, "topk_middleware.mechanisms.rel")


def upward_names(path: Path) -> set[str]:
    """The string constants of a file that name a module of the layers above the core."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and UPWARD_NAME.match(node.value)
    }


def test_the_core_imports_no_store_driver() -> None:
    found = []
    for module, path in project_modules(("topk_middleware",)).items():
        for name in imported_names(path, module):
            if name.split(".")[0] in STORE_DRIVERS:
                found.append(f"{module} imports {name}")
    assert found == [], "the core imports store drivers:\n" + "\n".join(sorted(found))


def test_the_core_names_a_layer_above_only_where_declared() -> None:
    """Every string of the core naming an adapter or front-end module is a declared late
    binding, and every declared binding names a class its module defines."""
    found = {
        (module, name)
        for module, path in project_modules(("topk_middleware",)).items()
        for name in upward_names(path)
    }
    assert found == LATE_BINDINGS
    modules = project_modules()
    for _, binding in LATE_BINDINGS:
        module, _, name = binding.partition(":")
        tree = ast.parse(modules[module].read_text())
        assert any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body), binding


def test_the_rules_see_a_driver_and_an_undeclared_name(tmp_path: Path) -> None:
    """The checkers themselves: a driver imported inside a function, and a module name in a
    string that importlib could load."""
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "def f():\n"
        "    import duckdb\n"
        "    return importlib.import_module('adapters.postgres')\n"
    )
    assert "duckdb" in imported_names(source, "topk_middleware.probe")
    assert upward_names(source) == {"adapters.postgres"}


# Where a store's capabilities are read: the core and the CLI read a store's traits
# (access.StoreTraits, RunTraits) and its optional protocols (access.implements), never an
# attribute found by probing (DESIGN invariant 15). A store is a `source` wherever it is named.
TRAITS_READERS = ("topk_middleware", "frontends.cli")
PROBES = ("getattr", "hasattr")


def store_probes(path: Path) -> list[str]:
    """Every getattr / hasattr call in the file whose object names a store (a `source`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in PROBES
            and node.args
            and re.search(r"\bsource\b", ast.unparse(node.args[0]))
        ):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "module",
    sorted(m for m in project_modules() if m.startswith(TRAITS_READERS)),
)
def test_the_core_reads_traits_and_probes_no_store(module: str) -> None:
    assert store_probes(project_modules()[module]) == []


def test_the_probe_rule_sees_a_probe(tmp_path: Path) -> None:
    """The checker itself: a probe of a store attribute, direct or through an access."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(source, access, args):\n"
        "    a = getattr(source, 'sensitivity', 1.0)\n"
        "    b = hasattr(access.source, 'read_oneshot')\n"
        "    return getattr(args, 'mode', None), a, b\n"
    )
    assert [p.split(": ", 1)[1] for p in store_probes(probe)] == [
        "getattr(source, 'sensitivity', 1.0)",
        "hasattr(access.source, 'read_oneshot')",
    ]


# The SQL store engine (adapters/sql/) holds what every SQL store shares; what differs is a
# dialect's (adapters/dialects/, one module or package per store), how a statement reaches the
# store a driver's (adapters/sql/driver.py). The engine names no store, imports no dialect and
# no driver package, asks no dialect its name and tests no driver's type: every difference is a
# method or a flag of adapters/sql/dialect.py or of a Driver. driver.py alone names drivers and
# imports their packages, lazily, inside the driver class that needs one. Dialects lie below the
# constructors (adapters/postgres, adapters/sqlalchemy, adapters/clickhouse.py, ...): a dialect
# imports the engine and the shared helpers, never a constructor.
ENGINE_PACKAGE = "adapters.sql"
DIALECTS_PACKAGE = "adapters.dialects"
DRIVER_MODULE = "adapters.sql.driver"
DIALECT_NAMES = ("clickhouse", "postgres", "duckdb", "sqlite", "mysql", "mariadb", "chdb")
SHARED_HELPERS = ("adapters._sql", "adapters.contributions")  # below engine and dialects


def module_level_imports(path: Path, module: str) -> set[str]:
    """The modules a file imports when it is imported: outside every function and class."""
    return imported_names(path, module, module_level=True)


def engine_modules() -> list[str]:
    return sorted(m for m in project_modules() if m.split(".")[:2] == ENGINE_PACKAGE.split("."))


@pytest.mark.parametrize("module", engine_modules())
def test_the_engine_has_no_dialect_branch(module: str) -> None:
    path = project_modules()[module]
    imported = imported_names(path, module)
    assert not [n for n in imported if n.startswith(DIALECTS_PACKAGE)], imported
    adapters = {n.split(".")[1] for n in imported if n.startswith("adapters.")}
    assert adapters <= {"sql", *(h.split(".")[1] for h in SHARED_HELPERS)}, adapters
    drivers = [n for n in imported if n.split(".")[0] in STORE_DRIVERS]
    if module == DRIVER_MODULE:  # lazily, inside the driver class that needs it
        top = [n for n in module_level_imports(path, module) if n.split(".")[0] in STORE_DRIVERS]
        assert top == [], f"driver.py imports a driver package at module level: {top}"
    else:
        assert drivers == [], drivers
    tree = ast.parse(path.read_text())
    if module != DRIVER_MODULE:
        texts = [
            n.value.lower()
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        named = [t for t in texts for d in DIALECT_NAMES if re.search(rf"\b{d}\b", t)]
        assert named == [], f"{path.name} names a store: {named}"
    compares = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare) and re.search(r"\.name\b", ast.unparse(n.left))
    ]
    assert compares == [], f"{path.name} branches on a dialect's name: {compares}"
    type_tests = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in ("isinstance", "issubclass", "type")
        and n.args
        and re.search(r"driver|dialect", ast.unparse(n.args[0]))
    ]
    assert type_tests == [], f"{path.name} tests a driver's or dialect's type: {type_tests}"


@pytest.mark.parametrize(
    "module",
    sorted(m for m in project_modules() if m.startswith(DIALECTS_PACKAGE + ".")),
)
def test_a_dialect_imports_no_constructor(module: str) -> None:
    """A dialect imports the engine, other dialect modules and the shared helpers only."""
    path = project_modules()[module]
    allowed = (ENGINE_PACKAGE, DIALECTS_PACKAGE, *SHARED_HELPERS)
    above = sorted(
        n
        for n in imported_names(path, module)
        if n.startswith("adapters.") and not n.startswith(allowed) and n != "adapters"
    )
    assert above == [], f"{module} imports {above}"


def test_the_engine_rules_see_a_branch_and_a_type_test(tmp_path: Path) -> None:
    """The checkers themselves: a dialect's name compared and a driver's type tested are
    found, and a driver imported inside a class is not a module-level import."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(t):\n    if t.dialect.name == 'x':\n        return isinstance(t.driver, object)\n"
    )
    tree = ast.parse(probe.read_text())
    assert any(
        isinstance(n, ast.Compare) and ".name" in ast.unparse(n.left) for n in ast.walk(tree)
    )
    assert any(
        isinstance(n, ast.Call)
        and getattr(n.func, "id", "") == "isinstance"
        and "driver" in ast.unparse(n.args[0])
        for n in ast.walk(tree)
    )
    lazy = tmp_path / "lazy.py"
    lazy.write_text("import re\nclass D:\n    def __init__(self):\n        import psycopg\n")
    assert module_level_imports(lazy, "adapters.sql.lazy") == {"re"}
    assert "psycopg" in imported_names(lazy, "adapters.sql.lazy")


@pytest.mark.parametrize("module", sorted(project_modules(SIZED)))
def test_a_long_module_says_why(module: str) -> None:
    path = project_modules(SIZED)[module]
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "Size:" in doc, (
        f"{path.relative_to(ROOT)} has {lines} lines (> {MAX_LINES}) and its docstring has no "
        "'Size:' paragraph saying why it is one module"
    )


# PostgresTable's package (adapters/postgres/: copy mode, and live mode in live/) stands on the
# engine: its modules import the engine, the PostgreSQL dialect, the shared helpers and each
# other, never another store's package; none is over MAX_LINES (no "Size:" waiver); no module
# opens a connection of its own (the engine's PsycopgDriver opens, reconnects and closes it).
POSTGRES_PACKAGE = "adapters.postgres"
POSTGRES_MAY_IMPORT = (
    ENGINE_PACKAGE,
    "adapters.dialects.postgres",
    POSTGRES_PACKAGE,
    *SHARED_HELPERS,
)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(
    "module", sorted(m for m in project_modules() if _within(m, (POSTGRES_PACKAGE,)))
)
def test_the_postgres_store_stands_on_the_engine(module: str) -> None:
    path = project_modules()[module]
    imported = imported_names(path, module)
    other = sorted(
        n for n in imported if n.startswith("adapters.") and not _within(n, POSTGRES_MAY_IMPORT)
    )
    assert other == [], f"{module} imports {other}"
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (> {MAX_LINES})"
    connects = [
        ast.unparse(n)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Call) and re.search(r"\bconnect$", ast.unparse(n.func))
    ]
    assert connects == [], f"{module} opens a connection itself: {connects}"


# The command line (frontends/cli/, one module per command group) loads light: when `topk-middleware
# --help` runs, its modules import at module level only the standard library, the URL parser and
# the names of adapters/url.py and topk_middleware/names.py, the SQL functions' commands
# (frontends/sql_cli.py) and each other; numpy, the stores' drivers, SQLAlchemy, tqdm and the
# core's mechanisms are imported inside the function that needs them
# (tests/frontends/test_cli_front.py checks the same in a process of its own). None is over
# MAX_LINES (no "Size:" waiver).
CLI_PACKAGE = "frontends.cli"
CLI_LOADS = ("adapters.url", "topk_middleware.names", "frontends.sql_cli", CLI_PACKAGE)


def loaded_imports(path: Path, module: str) -> set[str]:
    """The modules a file imports when it is imported, outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return imported_names(path, module, module_level=True, tree=tree)


@pytest.mark.parametrize(
    "module", sorted(m for m in project_modules() if _within(m, (CLI_PACKAGE,)))
)
def test_the_cli_loads_light(module: str) -> None:
    path = project_modules()[module]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (> {MAX_LINES})"
    heavy = sorted(
        name
        for name in loaded_imports(path, module)
        if name.split(".")[0] not in sys.stdlib_module_names and not _within(name, CLI_LOADS)
    )
    assert heavy == [], f"{module} imports {heavy} when it is imported"


def test_the_load_rule_sees_a_module_level_import(tmp_path: Path) -> None:
    """The checker itself: numpy imported at module level is found; under TYPE_CHECKING or
    inside a function it is not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nimport numpy\nif TYPE_CHECKING:\n    import duckdb\n"
        "def f():\n    import tqdm\n"
    )
    assert loaded_imports(probe, "frontends.cli.probe") == {
        "typing",
        "typing.TYPE_CHECKING",
        "numpy",
    }


# SparkTable's package (adapters/spark/: one module per idea, the package's docstring lists
# them) keeps its own engine (DataFrames, no connection): its modules import each other, the
# shared helpers and the SQL engine's column types (votes.py: the checks of
# adapters/contributions.py), never another store's package; none is over MAX_LINES (no
# "Size:" waiver).
SPARK_PACKAGE = "adapters.spark"
SPARK_MAY_IMPORT = (SPARK_PACKAGE, "adapters.sql.dialect", *SHARED_HELPERS)


@pytest.mark.parametrize(
    "module", sorted(m for m in project_modules() if _within(m, (SPARK_PACKAGE,)))
)
def test_the_spark_store_keeps_to_its_package(module: str) -> None:
    path = project_modules()[module]
    other = sorted(
        n
        for n in imported_names(path, module)
        if n.startswith("adapters.") and not _within(n, SPARK_MAY_IMPORT)
    )
    assert other == [], f"{module} imports {other}"
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (> {MAX_LINES})"
