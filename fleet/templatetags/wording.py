"""Template filters of fleet/wording.py, for every page that prints what the placer or the scheduler said:
`{% load wording %}` then `code|words` (or `code|coded`: the words, with the code as a tooltip), `message|headline`,
`message|brief`, `message|detail_lines`, `text|user_units`, `action|action_words`, `details|detail_words`."""

from __future__ import annotations

from django import template
from django.utils import timezone
from django.utils.timesince import timeuntil

from fleet import wording

register = template.Library()

register.filter("words", wording.words)
register.filter("user_units", wording.user_units)
register.filter("headline", wording.headline)
register.filter("brief", wording.brief)
register.filter("detail_lines", wording.detail_lines)
register.filter("readable_line", wording.readable_line)
register.filter("with_times", wording.with_times)
register.filter("figures", wording.figures)
register.filter("tally", wording.tally)
register.filter("request_words", wording.request_words)
register.filter("coded", wording.coded)
register.filter("action_words", wording.action_words)
register.filter("subject_words", wording.subject_words)
register.filter("detail_words", wording.detail_words)


@register.filter
def vm_shapes(vnodes) -> str:
    """A lease's VMs by shape, each shape once: "20 × (2 cores, 8 GiB, 20 GiB disk)", not the shape twenty times."""
    return wording.request_words({"vnodes": list(vnodes or ())})


@register.filter
def time_until(moment) -> str:
    """How long until `moment`, as `timeuntil` says it, but "less than a minute" under one: the slot table's
    countdown said "in 0 minutes" for a lease ending within the minute."""
    if moment is None:
        return ""
    if (moment - timezone.now()).total_seconds() < 60:
        return "less than a minute"
    return timeuntil(moment)


register.filter("mem", wording.mem)
register.filter("cores_of", wording.cores_of)
