"""A separate process that approves reschedules at a given instant (the seed-002 race needs two real processes:
each with its own connection and its own in-memory scheduler)."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotkeeper.settings")
    import django

    django.setup()
    from django.utils import timezone

    from leases.instances.actions import reschedules

    start_at = float(sys.argv[1])
    ids = [int(x) for x in sys.argv[2].split(",")]
    time.sleep(max(0.0, start_at - time.time()))
    results = reschedules.do_approve(None, ids, now=timezone.now())
    for r in results:
        print(f"{r.id} {'ok' if r.ok else 'pending'} {r.message}")


if __name__ == "__main__":
    main()
