"""Crash-test procedures: fault injection (`FaultyStore`, `FaultPlan`, `Fault`), an
explorer that kills a scenario before and after every store operation and checks that
nothing was lost or done twice, and `ClusterSimulation`, seeded runs of a whole cluster
(managers, operators, pauses, faults and clocks) checked against a model."""

from procstore import _public
from procstore.store.memory import MemoryStore
from procstore.testing.clock import SuspendableClock
from procstore.testing.cluster import ClusterSimulation, SimulationResult
from procstore.testing.cluster_store import Armed, LoggedOp, Process, ProcessStore
from procstore.testing.cluster_world_api import LedgerWorld, World
from procstore.testing.endpoints import gcs_storage_options, s3_storage_options
from procstore.testing.explorer import CrashExplorer, CrashPoint, ExplorationReport, Scenario
from procstore.testing.faults import FaultyStore
from procstore.testing.fsspec_faults import FaultyFileSystem
from procstore.testing.hostile import (
    HOSTILE_TEXTS,
    HostileStore,
    write_hostile_store,
    write_many_commits,
    write_parent_chain,
    write_parent_cycle,
)
from procstore.testing.kill import kill_manager
from procstore.testing.plan import Fault, FaultPlan, InjectedFailure, SimulatedCrash, StoreOp, crash_at
from procstore.testing.replay import ReplayReport, export_snapshot, replay
from procstore.testing.simulation import SimulatedLoop, run_simulated

__all__ = [
    "Armed",
    "ClusterSimulation",
    "LedgerWorld",
    "LoggedOp",
    "Process",
    "ProcessStore",
    "SimulationResult",
    "World",
    "CrashExplorer",
    "CrashPoint",
    "ExplorationReport",
    "Fault",
    "FaultPlan",
    "FaultyFileSystem",
    "FaultyStore",
    "HOSTILE_TEXTS",
    "HostileStore",
    "InjectedFailure",
    "MemoryStore",
    "ReplayReport",
    "Scenario",
    "SimulatedCrash",
    "SimulatedLoop",
    "StoreOp",
    "SuspendableClock",
    "crash_at",
    "export_snapshot",
    "gcs_storage_options",
    "kill_manager",
    "replay",
    "run_simulated",
    "s3_storage_options",
    "write_hostile_store",
    "write_many_commits",
    "write_parent_chain",
    "write_parent_cycle",
]

_public.present_under(__name__, globals())
