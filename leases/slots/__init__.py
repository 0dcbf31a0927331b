"""The slot table's parts (see `leases.slottable`). PURE: no Django."""
