"""What a new operator meets first: the API docs served from our own static files and behind the sign-in page,
a favicon, the demo's secrets kept private, and pages that do not log htmx errors when they are empty."""

from __future__ import annotations

import stat

import pytest
from django.test import Client

from slotkeeper.management.commands import demo


@pytest.mark.parametrize("path", ["/api/docs/"])
def test_a_signed_out_visitor_of_the_api_docs_is_sent_to_sign_in_and_back(db, path):
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


@pytest.mark.parametrize("path", ["/api/leases/", "/api/nodes/"])
def test_the_json_api_still_answers_a_signed_out_client_with_json(db, path):
    response = Client().get(path)
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")


def test_the_schema_is_still_an_api_endpoint_that_answers_401(db):
    assert Client().get("/api/schema/").status_code == 401


def test_swagger_ui_loads_from_our_own_static_files_not_a_cdn(vera):
    html = vera.get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()


def test_redocs_old_address_leads_to_swagger_ui_which_needs_nothing_from_outside(vera):
    # ReDoc fetched Google Fonts and a logo from cdn.redoc.ly whatever its settings (issue 46): it is not served.
    response = vera.get("/api/redoc/")
    assert response.status_code == 302 and response["Location"] == "/api/docs/"
    html = vera.get(response["Location"]).content.decode()
    assert "googleapis" not in html and "redoc.ly" not in html and "cdn" not in html.lower()


def test_every_console_page_names_its_icon_and_favicon_ico_leads_to_it(vera):
    assert 'rel="icon" href="/static/console/favicon.svg"' in vera.get("/").content.decode()
    response = Client().get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/console/favicon.svg"


def test_an_empty_reschedule_table_asks_htmx_to_include_no_boxes(otto):
    # The selector matched nothing on an empty table and htmx logged "returned no matches" on every refresh.
    html = otto.get("/reschedules/").content.decode()
    assert "No pending reschedules" in html
    assert "hx-include" not in html


def test_the_demo_writes_its_secrets_readable_by_their_owner_only(tmp_path):
    secret = tmp_path / "admin-password"
    secret.write_text("old")
    secret.chmod(0o644)  # an older demo's file
    demo.write_private(secret, "new-password")
    assert secret.read_text() == "new-password"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_the_demo_reminds_of_the_sign_in_with_the_password_and_where_it_is_kept():
    line = demo.sign_in_reminder("http://127.0.0.1:8001", "s3cret")
    assert "http://127.0.0.1:8001/" in line
    assert "admin / s3cret" in line
    assert ".demo/admin-password" in line


def test_make_run_passes_the_port_to_the_demo():
    makefile = (demo.settings.BASE_DIR / "Makefile").read_text()
    assert "PORT    ?= 8000" in makefile
    assert "manage.py demo --port $(PORT)" in makefile


class _Session:
    """The demo's `requests.Session`, served by the test client instead of a socket."""

    def __init__(self, client) -> None:
        self.client = client
        self.paths: list[str] = []

    def get(self, url: str, timeout: float):
        self.paths.append(url.removeprefix("http://demo"))
        return self.client.get(self.paths[-1])

    def post(self, url: str, json: dict, timeout: float):
        return self.client.post(url.removeprefix("http://demo"), json, format="json")


def test_a_restarted_demo_keeps_its_recovery_cases_instead_of_making_them_again(admin, fleet):
    session = _Session(admin)
    demo._demo_recovery_cases("http://demo", session)
    demo._demo_recovery_cases("http://demo", session)
    names = sorted(lease["name"] for lease in admin.get("/api/leases/", {"limit": 100}).json()["results"])
    assert names == ["crash-loop", "web-0", "web-1", "web-2"]
    assert admin.get("/api/groups/web/").status_code == 200


def test_a_new_demo_finds_out_whether_its_group_exists_without_a_404_warning(admin, fleet, caplog):
    session = _Session(admin)
    with caplog.at_level("WARNING", logger="django.request"):
        demo._demo_recovery_cases("http://demo", session)
    assert [r.getMessage() for r in caplog.records if r.name == "django.request"] == []
