"""Crash-test procedures: a fault-injecting store, and an explorer that kills a scenario
before and after every store operation and checks that nothing was lost or done twice."""

from procstore.testing.explorer import CrashExplorer, CrashPoint, ExplorationReport, Scenario
from procstore.testing.faults import FaultyStore, SimulatedCrash, StoreOp

__all__ = ["CrashExplorer", "CrashPoint", "ExplorationReport", "FaultyStore", "Scenario", "SimulatedCrash", "StoreOp"]
