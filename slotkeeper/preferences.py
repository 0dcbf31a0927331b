"""A person's console preferences: whether the single-key shortcuts are on (issue 46, item 4).

Kept with the account (`ConsolePreferences`), so a screen-reader user who turned them off finds them off in every
browser and after signing in again; and copied into the session at sign-in, so the page template reads it from the
session every request already loads: no page asks one more query for it (the slot table and the board are pinned at
ten). A change made in one browser reaches the others' sessions at their next sign-in.

No audit row: a personal display setting changes nothing another operator sees or relies on.
"""

from __future__ import annotations

from django.contrib.auth.signals import user_logged_in
from django.http import HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from slotkeeper.decorators import role_required
from slotkeeper.models import ConsolePreferences

SESSION_KEY = "console.shortcuts"


def shortcuts_on(request) -> bool:
    """Whether this request's person has the shortcuts on: the session's copy; on when none was taken (signed out,
    or a session from before preferences were kept)."""
    session = getattr(request, "session", None)
    return bool(session.get(SESSION_KEY, True)) if session is not None else True


def set_shortcuts(user, session, on: bool) -> None:
    """The one writer: the account's preference and this session's copy."""
    ConsolePreferences.objects.update_or_create(user=user, defaults={"shortcuts": on})
    session[SESSION_KEY] = on


def remember_at_sign_in(sender, request, user, **kwargs) -> None:
    """At every sign-in (the console's form, the admin's, a test's force_login), the session takes the account's
    preference: one query then, none on every page after."""
    if request is None or not hasattr(request, "session") or getattr(user, "pk", None) is None:
        return
    found = ConsolePreferences.objects.filter(user=user).values_list("shortcuts", flat=True).first()
    request.session[SESSION_KEY] = True if found is None else bool(found)


def connect() -> None:
    user_logged_in.connect(remember_at_sign_in, dispatch_uid="slotkeeper.preferences.remember_at_sign_in")


@require_POST
@role_required("viewer")
def shortcuts(request):
    """POST on=1 or on=0 from the `?` sheet's switch. console.js sends it as a fetch (204); without JavaScript the
    form posts and is sent back where it came from."""
    on = request.POST.get("on", "") == "1"
    set_shortcuts(request.user, request.session, on)
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204)
    back = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return HttpResponseRedirect(back if back and safe else "/")
