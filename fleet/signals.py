"""Fleet events other apps react to (leases marks instances lost when their node dies)."""

from django.dispatch import Signal

# Sent inside the transaction that marked the nodes dead; kwargs: node_ids (list[int]), now, reason.
nodes_died = Signal()
