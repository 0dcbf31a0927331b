"""Fleet events other apps react to (leases marks instances lost when their node dies)."""

from django.dispatch import Signal

# Sent inside the transaction that marked the nodes dead; kwargs: node_ids (list[int]), now, reason.
nodes_died = Signal()

# Sent inside the heartbeat's transaction; kwargs: node (Node), reports (list of instance dicts), now.
instances_reported = Signal()

# Sent inside the drain's transaction when a drain has a deadline; kwargs: node (Node), now.
node_draining = Signal()
