"""What an approval did, as the reschedule result page shows it: one line per instance that says either where it went
("placed on gpu-02 as 7-1-1") or why it did not move ("not placed: at capacity"), never a node name beside a bare
code, with the placer's verdict per node behind a disclosure.

The page used to print each approval's stored message whole: a move that found no node carries the placer's tally
and a line per node, so four pending moves were four paragraphs of ten lines, and a proposal's old target showed
beside the new reason code as if both applied (issue 13, item 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet import reports as codec
from fleet import wording
from fleet.models import Node
from leases.instances.actions.reschedules import ApprovalResult
from leases.instances.models import Reschedule

# Verdict lines shown under a move that did not happen; the report page has every node.
VERDICT_LINES = 12

KIND_WORDS = {"moved": "moved", "pending": "still pending", "stale": "review again", "refused": "not moved"}


@dataclass
class ResultLine:
    id: int
    instance: str
    kind: str  # moved / pending / stale / refused
    text: str  # the one line: where it went, or why not
    source: str = ""  # the node it was on
    target: str = ""  # the node it moved to: set for "moved" only
    new_instance: str = ""
    reason: str = ""  # the reason code it did not move for: set for "pending" only
    note: str = ""  # a second fact worth a glance ("proposed gpu-01: not here: at capacity")
    tally: str = ""  # the report's counts per reason, in words
    verdicts: list[wording.VerdictLine] = field(default_factory=list)
    more_verdicts: int = 0
    detail: str = ""  # the placer's own headline, above the verdicts
    report_id: int | None = None

    @property
    def label(self) -> str:
        return KIND_WORDS.get(self.kind, self.kind)


def stale_text(message: str) -> str:
    # The domain's message names the versions ("... changed since you saw it (version 3, now 4)"): keep those,
    # lead with what the operator should do.
    versions = message.rpartition(" it ")[2] if "(version" in message else ""
    return f"changed since you saw it, review again {versions}".rstrip()


def kind_of(result: ApprovalResult) -> str:
    if result.ok:
        return "moved"
    # A stale version means the operator must re-read that proposal before approving it: its own kind of line.
    if result.code == "stale":
        return "stale"
    if result.code == "pending":
        return "pending"
    return "refused"


def result_lines(results: list[ApprovalResult]) -> list[ResultLine]:
    """The approval's results as lines, with what the proposals and their newest reports say: three queries for
    any number of results (proposals with their reports, then node names for every report at once)."""
    proposals = {
        p.pk: p
        for p in Reschedule.objects.filter(pk__in=[r.id for r in results]).select_related(
            "instance__node", "proposed_node", "report"
        )
    }
    reports = {p.pk: p.report for p in proposals.values() if p.report_id}
    names = report_node_names(reports.values())
    return [line_for(r, proposals.get(r.id), reports.get(r.id), names) for r in results]


def report_node_names(reports) -> dict[int, str]:
    ids: set[int] = set()
    for report in reports:
        if codec.is_compact(report.verdicts):
            ids.update(codec.node_ids(report.verdicts))
    return dict(Node.objects.filter(pk__in=ids).values_list("pk", "name")) if ids else {}


def rows_of(report, names: dict[int, str]) -> list[dict]:
    if not codec.is_compact(report.verdicts):
        return report.rows
    return codec.decode(report.verdicts, names)


def line_for(
    result: ApprovalResult, proposal: Reschedule | None, report, names: dict[int, str]
) -> ResultLine:
    kind = kind_of(result)
    line = ResultLine(
        id=result.id,
        instance=proposal.instance.iid if proposal else "?",
        kind=kind,
        text=wording.user_units(wording.headline(result.message)),
        source=proposal.instance.node.name if proposal and proposal.instance.node_id else "",
        report_id=report.pk if report is not None else None,
    )
    if kind == "moved":
        line.target = result.node or ""
        line.new_instance = result.new_instance or ""
        line.text = f"placed on {line.target}" + (f" as {line.new_instance}" if line.new_instance else "")
        proposed = proposal.proposed_node.name if proposal and proposal.proposed_node_id else ""
        if proposed and proposed != line.target:
            rows = rows_of(report, names) if report is not None else []
            line.note = f"proposed {proposed}: {proposed_verdict(rows, proposed)}"
        return line
    if kind == "stale":
        line.text = stale_text(result.message)
        return line
    if kind == "refused":
        line.text = wording.user_units(result.message)
        return line
    # Still pending: the reason it waits, in words; the placer's verdicts per node behind the disclosure.
    line.reason = (proposal.blocked_by if proposal else "") or "unplaced"
    line.text = f"not placed: {wording.words(line.reason)}"
    rows = rows_of(report, names) if report is not None else []
    if proposal and proposal.proposed_node_id:
        proposed = proposal.proposed_node.name
        line.note = f"proposed earlier: {proposed}, {proposed_verdict(rows, proposed)}"
    if report is not None:
        line.detail = wording.user_units(wording.headline(report.message))
        line.tally = wording.tally(report.counts)
        line.verdicts, line.more_verdicts = wording.verdict_lines(rows, VERDICT_LINES)
    return line


def proposed_verdict(rows: list[dict], proposed: str) -> str:
    """What the newest report says of the node the proposal named: "not here: at capacity"."""
    row = next((r for r in rows if r["node"] == proposed), None)
    if row is None:
        return "no longer fits"
    if row["fit"]:
        return "fits, but another node ranked first"
    return f"not here: {wording.words(row['reason_code'])}"
