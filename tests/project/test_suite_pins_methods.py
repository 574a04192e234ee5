"""The suite's own rule: a test about the threshold algorithm's options pins the method.

`oracle`, `batching` and `costs` act only when the threshold method runs; under the default
`method="auto"` the planner may pick the one-shot mechanism (on small test tables it does), and a
test passing them would then test the one-shot mechanism while its name says otherwise. This scan
fails on any call of private_top_k / budgeted_private_top_k in tests/ that passes one of them
without `method=` (tests.helpers.threshold_run pins it and checks what ran).

Options passed as `**name` count too. The scan follows `name` within the calling function and
the module (every assignment in the function counts, wherever it stands): dict literals and
`dict(...)` calls assigned to it, each dict of a literal tuple or list a `for` loop takes it
from, `name[...] = ...` items, `|` unions, and the dicts a `pytest.mark.parametrize` gives a
parameter of that name. Each dict the call may receive must either hold no threshold-only
option or name the method; a dict the scan cannot follow (and no `method` beside it) fails too,
so that it cannot hide one.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
THRESHOLD_ONLY = {"oracle", "batching", "costs"}
RELEASES = {"private_top_k", "budgeted_private_top_k"}

KeySets = list[frozenset[str]]  # the key sets a dict expression may have
UNKNOWN: KeySets = [frozenset({"**"})]  # a dict the scan cannot follow: only "method" beside it


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _scopes(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.AST]:
    """The functions enclosing `node`, innermost first, then the module."""
    found = []
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            found.append(node)
    return found


def _product(left: KeySets | None, right: KeySets | None) -> KeySets:
    return [a | b for a in (left or UNKNOWN) for b in (right or UNKNOWN)]


def key_sets(expr: ast.expr, scopes: list[ast.AST], seen: frozenset[str] = frozenset()):
    """The key sets of a dict expression; None where the scan cannot tell."""
    if isinstance(expr, ast.Dict):
        sets: KeySets | None = [frozenset()]
        for key, value in zip(expr.keys, expr.values, strict=True):
            if key is None:  # **value
                sets = _product(sets, key_sets(value, scopes, seen))
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                sets = _product(sets, [frozenset({key.value})])
            else:
                sets = _product(sets, UNKNOWN)
        return sets
    if isinstance(expr, ast.Call) and getattr(expr.func, "id", None) == "dict" and not expr.args:
        sets = [frozenset(k.arg for k in expr.keywords if k.arg is not None)]
        for splat in (k.value for k in expr.keywords if k.arg is None):
            sets = _product(sets, key_sets(splat, scopes, seen))
        return sets
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _product(key_sets(expr.left, scopes, seen), key_sets(expr.right, scopes, seen))
    if isinstance(expr, ast.Name) and expr.id not in seen:
        return name_key_sets(expr.id, scopes, seen | {expr.id})
    return None


def _elements(expr: ast.expr) -> list[ast.expr] | None:
    return list(expr.elts) if isinstance(expr, ast.Tuple | ast.List) else None


def _parametrized(function: ast.AST, name: str, scopes: list[ast.AST]) -> list[ast.expr] | None:
    """The values `pytest.mark.parametrize` gives the parameter `name` of `function` (a literal
    list, or a module constant holding one)."""
    for decorator in getattr(function, "decorator_list", []):
        if not (isinstance(decorator, ast.Call) and len(decorator.args) >= 2):
            continue
        if getattr(decorator.func, "attr", None) != "parametrize":
            continue
        names_node, values = decorator.args[0], _elements(decorator.args[1])
        if values is None and isinstance(decorator.args[1], ast.Name):
            values = _constant_elements(decorator.args[1].id, scopes)
        if isinstance(names_node, ast.Constant) and isinstance(names_node.value, str):
            names = [n.strip() for n in names_node.value.split(",")]
        else:
            names = [getattr(e, "value", None) for e in _elements(names_node) or []]
        if name not in names or values is None:
            continue
        at = names.index(name)
        if len(names) == 1:
            return values
        rows = [_elements(v) for v in values]
        return None if any(r is None for r in rows) else [r[at] for r in rows]  # type: ignore[index]
    return None


def name_key_sets(name: str, scopes: list[ast.AST], seen: frozenset[str]) -> KeySets | None:
    """The key sets the variable `name` may hold, from its assignments in `scopes`."""
    for scope in scopes:
        sources: list[ast.expr] = []
        added: set[str] = set()
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id == name and node.value:
                        sources.append(node.value)
                    elif (
                        isinstance(target, ast.Subscript)
                        and getattr(target.value, "id", None) == name
                        and isinstance(target.slice, ast.Constant)
                    ):
                        added.add(str(target.slice.value))
            elif isinstance(node, ast.For) and getattr(node.target, "id", None) == name:
                elements = _elements(node.iter)
                if elements is None and isinstance(node.iter, ast.Name):
                    elements = _constant_elements(node.iter.id, scopes)
                if elements is None:
                    return None
                sources.extend(elements)
        parametrized = _parametrized(scope, name, scopes)
        if parametrized is not None:
            sources.extend(parametrized)
        if sources:
            sets: KeySets = []
            for source in sources:
                found = key_sets(source, scopes, seen)
                if found is None:
                    return None
                sets.extend(s | added for s in found)
            return sets
    return None


def _constant_elements(name: str, scopes: list[ast.AST]) -> list[ast.expr] | None:
    """The elements of a literal tuple / list assigned to `name` (a module constant)."""
    for scope in scopes:
        for node in ast.walk(scope) if isinstance(scope, ast.FunctionDef) else scope.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            value = getattr(node, "value", None)
            if any(getattr(t, "id", None) == name for t in targets) and value is not None:
                if _elements(value) is not None:
                    return _elements(value)
    return None


def unpinned_calls(path: Path) -> list[str]:
    """'file:line' of each release call that may pass a threshold-only option without a method
    (directly, or through `**name`: module docstring)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = _parents(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in RELEASES:
            continue
        keywords = {keyword.arg for keyword in node.keywords if keyword.arg is not None}
        if "method" in keywords:
            continue
        sets: KeySets | None = [frozenset(keywords)]
        scopes = _scopes(node, parents)
        for splat in (k.value for k in node.keywords if k.arg is None):
            sets = _product(sets, key_sets(splat, scopes))
        if any((s & THRESHOLD_ONLY or "**" in s) and "method" not in s for s in sets):
            found.append((node.lineno, f"{path.name}:{node.lineno}"))
    return [where for _, where in sorted(found)]


def test_threshold_options_come_with_a_pinned_method() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 10
    unpinned = [where for path in files for where in unpinned_calls(path)]
    assert not unpinned, f"pass method= (or use tests.helpers.threshold_run): {unpinned}"


def test_the_scan_finds_an_unpinned_call(tmp_path: Path) -> None:
    """The scan itself can fail: it flags unpinned calls and passes a pinned one."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "private_top_k(s, 1, 1.0, oracle='lazy')\n"
        "private_top_k(s, 1, 1.0, method='threshold', oracle='lazy')\n"
        "api.budgeted_private_top_k(b, s, 1, 1.0, costs=c)\n"
    )
    assert unpinned_calls(sample) == ["sample.py:1", "sample.py:3"]


def test_the_scan_follows_options_passed_as_a_dict(tmp_path: Path) -> None:
    """`**name` from an assignment, a loop over literal dicts, an item set later, a union, a
    module constant and a parametrize: flagged where one of its dicts has an option and no
    method, passed where every dict is pinned or harmless; an unfollowable one is flagged."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import pytest\n"
        "ORACLES = ({'oracle': 'lazy'}, {'oracle': 'eager'})\n"
        "def test_a(s):\n"
        "    options = {'seed': 1, 'oracle': 'eager'}\n"
        "    private_top_k(s, 1, 1.0, **options)\n"  # 5: flagged
        "    for o in ({'method': 'threshold', 'oracle': 'eager'}, {}):\n"
        "        private_top_k(s, 1, 1.0, **o)\n"  # 7: pinned or harmless
        "    for p in ({'method': 'threshold'}, {'oracle': 'eager'}):\n"
        "        private_top_k(s, 1, 1.0, **p)\n"  # 9: flagged
        "    args = dict(k=1, epsilon=1.0)\n"
        "    args['batching'] = None\n"
        "    private_top_k(s, **args)\n"  # 12: flagged
        "    for oracle in ORACLES:\n"
        "        private_top_k(s, **dict(k=1, **oracle))\n"  # 14: flagged
        "        private_top_k(s, **({'method': 'threshold'} | oracle))\n"  # 15: pinned
        "    private_top_k(s, 1, 1.0, **unknown())\n"  # 16: cannot follow: flagged
        "@pytest.mark.parametrize(('kw', 'x'), [({'oracle': 'lazy'}, 1), ({}, 2)])\n"
        "def test_b(s, kw, x):\n"
        "    private_top_k(s, 1, 1.0, **kw)\n"  # 19: flagged
        "@pytest.mark.parametrize('kw', [{'noise': 'laplace'}, {}])\n"
        "def test_c(s, kw):\n"
        "    private_top_k(s, 1, 1.0, **kw)\n"  # 22: harmless
    )
    assert unpinned_calls(sample) == [f"sample.py:{n}" for n in (5, 9, 12, 14, 16, 19)]
