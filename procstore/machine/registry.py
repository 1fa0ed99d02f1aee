"""`StateRegistry`: a machine's states as a tagged union, by class name.

A state is stored as `{TAG: "StateName", ...its fields}`, where TAG is the machine's tag
field (`region_migration_state` in GreptimeDB). A state whose only payload is an enum may
instead be stored externally tagged, `{"StateName": "Variant"}`, as serde writes a Rust
enum state such as `UpdateMetadata::Downgrade`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from procstore.machine.codec import MachineDataError, convert, to_builtins

if TYPE_CHECKING:
    from procstore.machine.machine import State

S = TypeVar("S", bound=type)


class DuplicateStateName(ValueError):
    """Two states registered under one name in the same machine (raised at import)."""


class StateRegistry:
    """The states one machine can be in. Register each with `@registry.state`."""

    def __init__(self, tag: str, machine: str = "") -> None:
        self.tag = tag
        self.machine = machine or tag
        self._by_name: dict[str, type[State[Any]]] = {}
        self._names: dict[type, str] = {}

    def state(self, cls: S) -> S:
        """Class decorator: register a dataclass state under its class name."""
        return self.register(cls.__name__)(cls)

    def register(self, name: str) -> Callable[[S], S]:
        """Register a state under an explicit name (the stored tag value)."""

        def decorate(cls: S) -> S:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(f"{self.machine}: state {cls.__qualname__} must be a dataclass")
            if name in self._by_name:
                other = self._by_name[name]
                raise DuplicateStateName(
                    f"{self.machine}: state name {name!r} is used by both "
                    f"{other.__module__}.{other.__qualname__} and {cls.__module__}.{cls.__qualname__}"
                )
            self._by_name[name] = cls  # type: ignore[assignment] # any registered class is a State
            self._names[cls] = name
            return cls

        return decorate

    @property
    def names(self) -> list[str]:
        return sorted(self._by_name)

    def name_of(self, state: State[Any]) -> str:
        try:
            return self._names[type(state)]
        except KeyError:
            raise TypeError(
                f"{self.machine}: {type(state).__qualname__} is not a registered state "
                f"(decorate it with @{self.tag}_registry.state)"
            ) from None

    def dump(self, state: State[Any]) -> dict[str, Any]:
        """`{TAG: name, **fields}` (the tag first, then the fields in declaration order)."""
        fields = to_builtins(state)
        return {self.tag: self.name_of(state), **fields}

    def load(self, value: Any, field: str = "state") -> State[Any]:
        """Rebuild a state; `MachineDataError` names the field and, for a bad tag, the known ones."""
        if not isinstance(value, dict):
            raise MachineDataError(self.machine, field, f"expected an object, got {type(value).__name__}")
        if self.tag in value:
            name = value[self.tag]
            cls = self._by_name.get(name) if isinstance(name, str) else None
            if cls is None:
                raise MachineDataError(
                    self.machine,
                    f"{field}.{self.tag}",
                    f"unknown state {name!r}; known states: {', '.join(self.names)}",
                )
            payload = {k: v for k, v in value.items() if k != self.tag}
            return convert(payload, cls, machine=self.machine, field=field)
        if len(value) == 1:
            [(name, payload)] = value.items()
            cls = self._by_name.get(name)
            if cls is not None:
                return self._load_external(cls, payload, f"{field}.{name}")
        raise MachineDataError(
            self.machine,
            field,
            f"no {self.tag!r} tag (expected {{{self.tag!r}: one of {', '.join(self.names)}, ...}})",
        )

    def _load_external(self, cls: type[State[Any]], payload: Any, field: str) -> State[Any]:
        """`{"Name": value}`: the state's single (enum) field holds `value`."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        if len(fields) != 1:
            raise MachineDataError(
                self.machine, field, f"{cls.__name__} has {len(fields)} fields; the short form needs exactly one"
            )
        return convert({fields[0].name: payload}, cls, machine=self.machine, field=field.rsplit(".", 1)[0])
