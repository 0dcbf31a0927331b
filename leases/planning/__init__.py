"""The plan applier: the boundary between the database and the pure scheduler (docs/plan-applier.md).

A lease request's walk, top-down, one module a step:

- `waiting.await_decision`: the request, stored as an intent (a lease in state `new`), waits for a pass to decide
  it, running that pass itself when the plan lock is free.
- `passes.planning`: the pass, one transaction under the plan lock. `_pass` reads the fleet, then:
  - `restore`: the scheduler this process cached, kept, caught up, or restored from the database;
  - `prepare`: the fleet's exclusions handed over, time settled, the now-gate's figures observed;
  - `intents`: every waiting request planned at once (group commit), the queue run once, each decision written
    where its waiter reads it;
  - the caller's part (a cancel, an approval, the tick);
  - `applying.apply`: the change journal written (reservations, allocations, lease rows, history, instances);
  - `reporting`: a report for every lease placed, and the isolated, stranded and displaced leases said so;
  - the version bumped, and the scheduler cached again when the transaction commits.

Beside the walk: `reading.consulting`, a question asked of the cached scheduler without a pass (a preview);
`plan.Planning`, what a pass hands its caller; `records`, the rows in the scheduler's terms.
"""
