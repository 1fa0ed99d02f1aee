"""Tools to crash-test procedures: a fault-injecting store and the crash it simulates."""

from procstore.testing.faults import FaultyStore, SimulatedCrash, StoreOp

__all__ = ["FaultyStore", "SimulatedCrash", "StoreOp"]
