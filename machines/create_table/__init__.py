"""Create a table and its regions (a parent with one subprocedure per region)."""

from procstore_machines.create_table.machine import CreateRegion, CreateTable, new_create_table, register

__all__ = ["CreateRegion", "CreateTable", "new_create_table", "register"]
