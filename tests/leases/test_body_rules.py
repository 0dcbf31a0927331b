"""A body is read as the docs say (issue 47): UTF-8 JSON, each key once. A repeated key was read last-wins and a
UTF-16 body was decoded: both are now a 400 that says why, and nothing is stored."""

from __future__ import annotations

import json

import pytest

from leases.models import Lease

pytestmark = pytest.mark.django_db

BODY = {"name": "job", "type": "best_effort", "duration_s": 600, "nodes": [{"mem_mib": 1024}]}


def test_a_key_given_twice_is_a_400(operator, fleet):
    raw = '{"name": "job", "type": "immediate", "type": "best_effort", "duration_s": 600, "nodes": [{"mem_mib": 1024}]}'
    response = operator.generic("POST", "/api/leases/", raw, content_type="application/json")
    assert response.status_code == 400 and "'type' appears twice" in response.json()["detail"]
    assert not Lease.objects.exists()


@pytest.mark.parametrize("charset", ["utf-16", "latin-1", "ISO-8859-1"])
def test_a_body_in_another_charset_is_a_400(operator, fleet, charset):
    raw = json.dumps(BODY).encode(charset if charset != "ISO-8859-1" else "latin-1")
    response = operator.generic(
        "POST", "/api/leases/", raw, content_type=f"application/json; charset={charset}"
    )
    assert response.status_code == 400 and "must be UTF-8" in response.json()["detail"]
    assert not Lease.objects.exists()


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "utf8"])
def test_utf_8_said_in_any_spelling_is_read(operator, fleet, charset):
    raw = json.dumps(BODY).encode()
    response = operator.generic(
        "POST", "/api/leases/", raw, content_type=f"application/json; charset={charset}"
    )
    assert response.status_code == 201, response.content


def test_approve_many_says_its_body_is_required_and_refuses_none(operator):
    """Schemathesis sent approve-many with no body, which the schema allowed (the body was optional) and the server
    refused: the committed schema now says the body is required, as the server reads it."""
    import yaml
    from django.conf import settings

    schema = yaml.safe_load((settings.BASE_DIR / "docs" / "openapi.yaml").read_text())
    assert schema["paths"]["/api/reschedules/approve/"]["post"]["requestBody"]["required"] is True
    response = operator.post("/api/reschedules/approve/")
    assert response.status_code == 400
