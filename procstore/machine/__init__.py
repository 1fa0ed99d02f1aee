"""Typed state machines: states as dataclasses in a tagged union, a persistent context
stored with the state, and a volatile context rebuilt after every load."""

from procstore.machine.codec import MachineDataError
from procstore.machine.duration import Duration
from procstore.machine.machine import MachineContext, State, StateMachine
from procstore.machine.registry import DuplicateStateName, StateRegistry

__all__ = [
    "Duration",
    "DuplicateStateName",
    "MachineContext",
    "MachineDataError",
    "State",
    "StateMachine",
    "StateRegistry",
]
