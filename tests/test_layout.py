"""The repository's shape and the public surface: what docs/api.md promises is what the
packages export, under the names users import, and the folders sit where CONTRIBUTING's
layout says."""

from __future__ import annotations

import importlib
import pickle
import re
import tomllib
import types
import typing
from pathlib import Path

import pytest

import procstore

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_PACKAGES = ("procstore", "procstore.machine", "procstore.testing", "procstore.store")


def documented_names() -> set[str]:
    """Every identifier inside a code span of docs/api.md (fenced examples left out: their
    fences would pair the backticks of the spans around them wrongly)."""
    text = re.sub(r"^```.*?^```", "", (ROOT / "docs" / "api.md").read_text(), flags=re.S | re.M)
    return {name for span in re.findall(r"`([^`]+)`", text) for name in re.findall(r"[A-Za-z_]\w*", span)}


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_every_exported_name_is_in_the_api_contract(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) - documented_names() == set()


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_a_package_offers_no_public_name_beyond_its_all(package: str) -> None:
    module = importlib.import_module(package)
    offered = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    }
    assert offered - set(module.__all__) == set()


def test_the_store_package_exports_only_what_backend_writers_are_promised() -> None:
    import procstore.store

    assert set(procstore.store.__all__) == {"StateStore", "WrappingStore", "open_state_store", "ProcedureMessage"}


def test_a_name_the_store_package_no_longer_exports_still_imports_with_a_warning_naming_its_module() -> None:
    from procstore.store.procedure_store import ProcedureStore

    with pytest.warns(DeprecationWarning, match=r"store\.ProcedureStore .* procstore\.store\.procedure_store"):
        from procstore.store import ProcedureStore as former
    assert former is ProcedureStore
    with pytest.raises(ImportError):
        from procstore.store import NoSuchName  # noqa: F401


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_public_classes_and_functions_name_the_package_that_exports_them(package: str) -> None:
    module = importlib.import_module(package)
    named_elsewhere = {
        name: value.__module__
        for name in module.__all__
        if isinstance(value := getattr(module, name), type | types.FunctionType) and value.__module__ != package
    }
    assert named_elsewhere == {}


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_the_type_hints_of_public_classes_still_resolve_under_the_exporting_package(package: str) -> None:
    """`get_type_hints` (and msgspec, pydantic, dataclass tools) reads a class's text
    annotations in the module `__module__` names: the exporting package's, now."""
    module = importlib.import_module(package)
    unresolved = {}
    for name in module.__all__:
        if isinstance(value := getattr(module, name), type):
            try:
                typing.get_type_hints(value)
            except NameError as e:
                unresolved[name] = str(e)
    assert unresolved == {}

    class Mine(procstore.Procedure):  # a user's subclass: the base's hints resolve too
        type_name = "mine"

    assert {"type_name", "rollback_supported"} <= set(typing.get_type_hints(Mine))


def test_public_values_and_errors_survive_pickling() -> None:
    values: list[object] = [
        procstore.ProcedureId.random(),
        procstore.StoreError("cannot write procedure/x/0000000000.step"),
        procstore.ProcedureStateKind.DONE,
        procstore.LockKey([procstore.StringKey.exclusive("table/42")]),
    ]
    for value in values:
        copy = pickle.loads(pickle.dumps(value))
        assert type(copy) is type(value) and str(copy) == str(value)


def test_the_top_level_holds_the_library_the_example_machines_the_tests_and_the_benchmarks() -> None:
    folders = {path.name for path in ROOT.iterdir() if path.is_dir() and not path.name.startswith(".")}
    assert {"procstore", "machines", "tests", "benchmarks", "docs"} <= folders
    assert "procstore_machines" not in folders  # the installed name, never a folder


def test_the_example_machines_install_as_procstore_machines_from_the_machines_folder() -> None:
    import procstore_machines

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"procstore_machines": "machines"}
    assert Path(procstore_machines.__file__).resolve().parent == ROOT / "machines"
    # The package list is explicit (discovery cannot rename a folder): it names every package folder.
    folders = {init.parent for top in ("procstore", "machines") for init in (ROOT / top).rglob("__init__.py")}
    assert set(config["packages"]) == {installed_name(folder) for folder in folders}


def installed_name(folder: Path) -> str:
    top, *below = folder.relative_to(ROOT).parts
    return ".".join(["procstore_machines" if top == "machines" else top, *below])
