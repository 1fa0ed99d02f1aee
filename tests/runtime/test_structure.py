"""The runtime's shape, checked: what a term's runners share is split into parts of at most
ten fields each, and each part changes only through its own methods (or, for the children
recovery found, in recovery's module)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

import procstore
from procstore._runtime.context import ManagerContext
from procstore._runtime.leadership import Leadership
from procstore._runtime.lock_table import LockTable
from procstore._runtime.meta import ProcedureMeta, RunRecord, WatchedState, WrittenKeys
from procstore._runtime.operator import OperatorRequests
from procstore._runtime.recovery import StoredProcedures
from procstore._runtime.registry import Registry
from procstore._runtime.term import SingleTerm, Term, TermLease, TermSettings

PACKAGE = Path(procstore.__file__).parent
SHARED = [
    ManagerContext,
    Registry,
    LockTable,
    OperatorRequests,
    StoredProcedures,
    Term,
    TermLease,
    TermSettings,
    SingleTerm,
    Leadership,
    procstore.ProcedureManager,
    ProcedureMeta,
    RunRecord,
    WrittenKeys,
    WatchedState,
]
OWNERS = {"recovered": "_runtime/recovery.py"}
"""A part whose fields a module other than its class's own may write: recovery fills the
children it found."""
MUTATORS = {"add", "append", "clear", "discard", "extend", "pop", "remove", "setdefault", "update"}


def fields(cls: type) -> set[str]:
    """Its `__slots__`, or else the `self.x` its `__init__` assigns; for a class without an
    `__init__` of its own, its annotated class attributes (fields with a default until set)."""
    slots = cls.__dict__.get("__slots__")
    if slots is not None:
        return {slots} if isinstance(slots, str) else set(slots)
    if "__init__" not in cls.__dict__:
        return set(inspect.get_annotations(cls))
    init = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))  # type: ignore[misc]
    return {
        target.attr
        for node in ast.walk(init)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }


@pytest.mark.parametrize("cls", SHARED, ids=lambda cls: cls.__qualname__)
def test_no_shared_object_has_more_than_ten_fields(cls: type) -> None:
    assert len(fields(cls)) <= 10, sorted(fields(cls))


def _ctx_chain(node: ast.expr) -> list[str] | None:
    """`ctx.a.b` or `self.ctx.a.b` (through subscripts) as ["a", "b"]; None for anything else."""
    names: list[str] = []
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        else:
            break
    names.reverse()
    if isinstance(node, ast.Name) and node.id == "ctx":
        return names
    if isinstance(node, ast.Name) and node.id == "self" and names[:1] == ["ctx"]:
        return names[1:]
    return None


def ctx_writes(source: str, module: str) -> list[str]:
    """Where `module` (its path in the package) writes a field of a `ManagerContext` or of one of its parts."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            chain = _ctx_chain(node.func.value)
            if chain is not None and len(chain) >= 2:  # ctx.part.field.add(...), not ctx.part.method(...)
                targets = [node.func.value]
        for target in targets:
            chain = _ctx_chain(target)
            if chain and module != OWNERS.get(chain[0]):
                found.append(f"{module}:{getattr(node, 'lineno', 0)}: ctx.{'.'.join(chain)}")
    return found


def test_no_module_writes_the_fields_of_a_part_it_does_not_own() -> None:
    writes = [
        write
        for path in sorted(PACKAGE.rglob("*.py"))
        for write in ctx_writes(path.read_text(), str(path.relative_to(PACKAGE)))
    ]
    assert writes == []


def test_the_structural_check_sees_writes() -> None:
    source = (
        "def f(ctx, self):\n"
        "    ctx.running = False\n"
        "    self.ctx.lock_waits[1] = 'k'\n"
        "    ctx.recovered.children_of.pop(1)\n"
        "    ctx.recovered.add_child(1, 2)\n"
    )
    assert ctx_writes(source, "_runtime/runner.py") == [
        "_runtime/runner.py:2: ctx.running",
        "_runtime/runner.py:3: ctx.lock_waits",
        "_runtime/runner.py:4: ctx.recovered.children_of",
    ]
    assert ctx_writes(source, "_runtime/recovery.py") == [
        "_runtime/recovery.py:2: ctx.running",
        "_runtime/recovery.py:3: ctx.lock_waits",
    ]


def test_kill_manager_goes_through_a_seam_not_the_managers_private_fields() -> None:
    tree = ast.parse((PACKAGE / "testing" / "kill.py").read_text())
    private = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
    ]
    assert private == []
