"""A separate process that submits one lease and prints its decision, how long it waited and whether another
process's pass woke it (the group commit's cross-process wake-up needs a real second process)."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotkeeper.settings")
    import django

    django.setup()
    from django.utils import timezone

    from leases import actions
    from slotkeeper import planwake

    # A long fallback poll: an answer within seconds can then only have come from the NOTIFY.
    planwake.FALLBACK_POLL_S = 30.0
    spec = actions.LeaseSpec(
        name=sys.argv[1],
        type="best_effort",
        duration_s=3600,
        vnodes=[{"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 0}],
    )
    began = time.monotonic()
    done = actions.do_submit_lease(None, spec, now=timezone.now())
    waited = time.monotonic() - began
    print(
        f"{done.lease.pk} {done.decision.lease_id} {done.report.subject} {done.report.outcome} "
        f"{planwake.heard_from_others()} {waited:.2f}"
    )
    planwake.stop()


if __name__ == "__main__":
    main()
