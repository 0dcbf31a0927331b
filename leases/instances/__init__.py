"""Instances, restarts, node loss, reschedules, groups, alerts and drains: the package above the lease core.

Layers inside, as everywhere: `rules` (PURE: restart and loss policy), `actions/<noun>.py` (the only writers,
each `do_*` one transaction with its audit row and its events after commit), `reads` and `placing` (reads apart
from writes), `api/` and `views` (the surfaces). The lease core below (leases/*) keeps only what a lease needs
(its instance rows, leases/instance_rows.py) and imports nothing from here; fleet below it neither.
"""
