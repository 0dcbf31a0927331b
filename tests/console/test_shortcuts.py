"""The keyboard's server side (issue 46, item 4), through Django's test client: the nav and the `?` sheet come from one
list of go-to keys (an operator's pages only for an operator); the single-key shortcuts switch off per person, kept
with the account and copied into the session at sign-in, so every page says so without one more query."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from slotkeeper.context import GO_TO
from slotkeeper.models import ConsolePreferences
from slotkeeper.preferences import SESSION_KEY
from tests.console.conftest import signed_in


def body_shortcuts(client) -> str:
    page = client.get(reverse("lease-list")).content.decode()
    return re.search(r'<body [^>]*data-shortcuts="(on|off)"', page).group(1)


def test_the_nav_and_the_sheet_list_the_same_go_to_keys(otto, vera):
    page = otto.get(reverse("lease-list")).content.decode()
    nav = page[page.index('<nav aria-label="Pages">') : page.index("</nav>")]
    sheet = page[page.index('<dialog id="shortcuts"') : page.index("</dialog>")]
    nav_keys = re.findall(r'data-goto="(\w)"', nav)
    assert nav_keys == [g.key for g in GO_TO if g.nav]
    listed = re.findall(r"<dt><kbd>g</kbd> <kbd>(\w)</kbd></dt>", sheet)
    assert listed == [g.key for g in GO_TO], "an operator's sheet lists every page, the nav's and two more"
    assert len(set(listed)) == len(listed), "one page a letter"
    # The sheet's links are the pages' own URLs.
    for g in GO_TO:
        assert f'<a href="{reverse(g.url_name)}" data-goto="{g.key}">' in sheet
    # A viewer is offered no key to a page that would refuse them.
    viewer = vera.get(reverse("lease-list")).content.decode()
    assert 'data-goto="n"' not in viewer and 'data-goto="w"' not in viewer
    assert re.findall(r'data-goto="(\w)"', viewer[: viewer.index("</nav>")]) == nav_keys


def test_the_current_page_is_marked_in_the_nav(otto):
    page = otto.get(reverse("slot-table")).content.decode()
    assert re.search(r'href="/slots/" data-goto="s" aria-current="page">Slot table<', page)
    assert page.count('aria-current="page"') == 1


def test_shortcuts_are_on_until_switched_off_and_stay_off_for_the_person(otto):
    assert body_shortcuts(otto) == "on"
    response = otto.post(reverse("console-shortcuts"), {"on": "0"}, headers={"HX-Request": "true"})
    assert response.status_code == 204
    assert ConsolePreferences.objects.get(user__username="otto").shortcuts is False
    assert body_shortcuts(otto) == "off"
    assert re.search(
        r'id="shortcuts-on" +aria-describedby', otto.get(reverse("lease-list")).content.decode()
    ), "the sheet's switch is unticked"
    # Another browser, a new sign-in: the session takes the account's choice.
    elsewhere = Client()
    elsewhere.force_login(get_user_model().objects.get(username="otto"))
    assert elsewhere.session[SESSION_KEY] is False
    assert body_shortcuts(elsewhere) == "off"
    otto.post(reverse("console-shortcuts"), {"on": "1"}, headers={"HX-Request": "true"})
    assert body_shortcuts(otto) == "on"
    assert ConsolePreferences.objects.get(user__username="otto").shortcuts is True


def test_a_page_reads_the_preference_without_a_query_of_its_own(otto):
    def queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            otto.get(reverse("lease-list"))
        return [q["sql"] for q in captured.captured_queries]

    before = queries()
    otto.post(reverse("console-shortcuts"), {"on": "0"}, headers={"HX-Request": "true"})
    after = queries()
    assert len(after) == len(before)
    assert not [sql for sql in before + after if "consolepreferences" in sql.lower()]


def test_without_javascript_the_form_posts_and_returns_to_the_page(vera):
    response = vera.post(reverse("console-shortcuts"), {"on": "0", "next": "/slots/?zoom=1h"})
    assert response.status_code == 302 and response["Location"] == "/slots/?zoom=1h"
    response = vera.post(reverse("console-shortcuts"), {"on": "1", "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert body_shortcuts(vera) == "on"


@pytest.mark.django_db
def test_the_switch_needs_a_signed_in_person_a_post_and_its_csrf_token():
    url = reverse("console-shortcuts")
    anonymous = Client()
    assert anonymous.post(url, {"on": "0"}).status_code == 302  # to sign in
    assert not ConsolePreferences.objects.exists()
    strict = signed_in("nina", "viewer")
    strict.handler.enforce_csrf_checks = True
    assert strict.post(url, {"on": "0"}).status_code == 403
    assert strict.get(url).status_code == 405
    assert not ConsolePreferences.objects.exists()
