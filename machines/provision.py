"""Provision a service: a parent procedure and one subprocedure per resource.

The "cloud" is a local directory (`world`): resources are JSON files under
`resources/<service>/`, and the service catalog is `catalog/<service>.json`. Every step is
idempotent: it writes the same bytes whether it runs once or again after a crash.

    create    -> catalog says "creating"
    resources -> one CreateResource child per resource, each writes then verifies its file
    register  -> catalog says "ready" with every resource's checksum
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from procstore import Context, LockKey, Procedure, ProcedureId, ProcedureWithId, Status, StringKey

_NAMESPACE = uuid.UUID("2f1c7a52-51c4-4d8e-9f4e-6e0c2a7b9d10")


def write_atomically(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON so that a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temp.write_bytes(json.dumps(payload, sort_keys=True).encode())
    os.replace(temp, path)


def resource_body(service: str, name: str) -> dict[str, Any]:
    return {"service": service, "resource": name, "config": {"replicas": 3, "zone": f"zone-{len(name) % 3}"}}


def checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CreateResource(Procedure):
    """Creates one resource file, then checks it reads back intact."""

    type_name = "machines::CreateResource"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def dump(self) -> str:
        return json.dumps(self.data, sort_keys=True)

    @property
    def path(self) -> Path:
        return Path(self.data["world"], "resources", str(self.data["service"]), f"{self.data['name']}.json")

    async def execute(self, ctx: Context) -> Status:
        if self.data.get("stage", "write") == "write":
            write_atomically(self.path, resource_body(self.data["service"], self.data["name"]))
            self.data["stage"] = "verify"
            return Status.executing()
        if json.loads(self.path.read_bytes()) != resource_body(self.data["service"], self.data["name"]):
            self.data["stage"] = "write"
            return Status.executing()
        return Status.done(checksum(self.path))

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(f"service/{self.data['service']}/{self.data['name']}")])


class ProvisionService(Procedure):
    """Creates a service's resources (as subprocedures) and registers it in the catalog."""

    type_name = "machines::ProvisionService"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    def create(cls, world: Path, service: str, resources: list[str]) -> ProvisionService:
        return cls({"world": str(world), "service": service, "resources": resources, "stage": "create"})

    def dump(self) -> str:
        return json.dumps(self.data, sort_keys=True)

    @property
    def catalog(self) -> Path:
        return Path(self.data["world"]) / "catalog" / f"{self.data['service']}.json"

    def child_id(self, ctx: Context, name: str) -> ProcedureId:
        """Deterministic, so a re-run after a crash names the same children."""
        return ProcedureId(uuid.uuid5(_NAMESPACE, f"{ctx.procedure_id}/{name}"))

    def children(self, ctx: Context, names: list[str]) -> list[ProcedureWithId]:
        base = {"world": self.data["world"], "service": self.data["service"]}
        return [ProcedureWithId(self.child_id(ctx, n), CreateResource({**base, "name": n})) for n in names]

    async def execute(self, ctx: Context) -> Status:
        stage = self.data["stage"]
        if stage == "create":
            write_atomically(self.catalog, {"service": self.data["service"], "state": "creating"})
            self.data["stage"] = "resources"
            return Status.executing()
        if stage == "resources":
            self.data["stage"] = "register"
            return Status.suspended(self.children(ctx, self.data["resources"]))
        states = {n: ctx.provider.procedure_state(self.child_id(ctx, n)) for n in self.data["resources"]}
        missing = [n for n, s in states.items() if s is None]
        if missing:  # a crash came between this state's write and the children's first writes
            return Status.suspended(self.children(ctx, missing))
        failed = [n for n, s in states.items() if s is not None and not s.is_done()]
        if failed:
            raise RuntimeError(f"resources failed: {failed}")
        sums = {
            n: checksum(self.catalog.parent.parent / "resources" / self.data["service"] / f"{n}.json")
            for n in self.data["resources"]
        }
        write_atomically(self.catalog, {"service": self.data["service"], "state": "ready", "resources": sums})
        return Status.done(sums)

    def lock_key(self) -> LockKey:
        return LockKey([StringKey.exclusive(f"service/{self.data['service']}")])


def check_world(world: Path, services: dict[str, list[str]]) -> list[str]:
    """The invariants a finished run must hold; returns what is broken (empty if nothing)."""
    broken: list[str] = []
    for service, resources in services.items():
        catalog_path = world / "catalog" / f"{service}.json"
        if not catalog_path.exists():
            broken.append(f"{service}: no catalog entry")
            continue
        catalog = json.loads(catalog_path.read_bytes())
        if catalog.get("state") != "ready":
            broken.append(f"{service}: catalog state is {catalog.get('state')!r}, not 'ready'")
        on_disk = sorted(p.stem for p in (world / "resources" / service).glob("*.json"))
        if on_disk != sorted(resources):
            broken.append(f"{service}: resources on disk {on_disk} != {sorted(resources)}")
        for name in resources:
            path = world / "resources" / service / f"{name}.json"
            if path.exists() and catalog.get("resources", {}).get(name) != checksum(path):
                broken.append(f"{service}/{name}: catalog checksum does not match the resource")
    return broken
