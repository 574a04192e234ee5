"""Parallel runs: tests marked with one `xdist_group` run on one worker (tests/conftest.py).

pytest-xdist's `--dist loadgroup` finds the groups by renaming each test (`nodeid@group`) on
the workers, which pytest 9 no longer allows (a node's id is read-only), so it silently
schedules every test on its own. This plugin gives the controller the groups instead: it reads
each test file's syntax tree for `pytestmark = pytest.mark.xdist_group("name")` (the whole
module) and `@pytest.mark.xdist_group("name")` on a test function or class, and schedules by
those scopes with xdist's own LoadGroupScheduling. A test without a group is a scope of its own;
the largest scopes (the groups) are handed out first, so a long group does not trail behind.

It also sets how many workers `-n auto` starts: one per core the process may run on, plus one.
Much of a test's time is spent waiting for a server (a commit's fsync, a round trip, a lock), and
the extra worker runs meanwhile: on 2 cores the suite took 254 s with 3 workers, 280-301 s with
2 and 259 s with 4. PYTEST_XDIST_AUTO_NUM_WORKERS overrides it, as in pytest-xdist.
"""

from __future__ import annotations

import ast
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest


def _group_of(decorator: ast.expr) -> str | None:
    """The name in `pytest.mark.xdist_group("name")` / `(name="name")`, else None."""
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
        return None
    if decorator.func.attr != "xdist_group":
        return None
    values = [*decorator.args, *(k.value for k in decorator.keywords if k.arg == "name")]
    if values and isinstance(values[0], ast.Constant):
        return str(values[0].value)
    return "default"


@cache
def groups_in(path: Path) -> dict[str, str]:
    """{"" (the module) or a top-level function / class name: its group} for one test file."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks = (
                node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            )
            for mark in marks:
                if (group := _group_of(mark)) is not None:
                    found[""] = group
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for decorator in node.decorator_list:
                if (group := _group_of(decorator)) is not None:
                    found[node.name] = group
    return found


def group_of(root: Path, nodeid: str) -> str | None:
    """The group of a test given its node id (`path::name[params]` or `path::Class::name`)."""
    path, _, rest = nodeid.partition("::")
    groups = groups_in(root / path)
    name = rest.split("::", 1)[0].split("[", 1)[0]
    return groups.get(name, groups.get(""))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Workers for `-n auto`: the cores this process may use, plus one (module docstring)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    root = config.rootpath

    class FileMarkGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid.rsplit("]", 1)[-1]:  # xdist's own suffix, where pytest allows it
                return super()._split_scope(nodeid)
            group = group_of(root, nodeid)
            return nodeid if group is None else f"group:{group}"

    return FileMarkGroups(config, log)
