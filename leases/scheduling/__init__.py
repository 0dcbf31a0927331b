"""The lease scheduler's layers (see `leases.scheduler.Scheduler`). PURE: no Django."""
