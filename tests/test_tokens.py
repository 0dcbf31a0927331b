"""Issuing a token goes through its action: the user gets the role, the token is stored as a digest, and the
audit feed says so."""

from __future__ import annotations

import pytest
from django.utils import timezone

from slotkeeper.domain import DomainError
from slotkeeper.models import ApiToken, AuditEntry, hash_token
from slotkeeper.roles import role_of
from slotkeeper.tokens import do_issue_token

pytestmark = pytest.mark.django_db


def test_a_token_is_issued_once_with_its_role_and_an_audit_row():
    raw = do_issue_token(None, "integration", "operator", now=timezone.now(), name="ci")
    token = ApiToken.objects.get(digest=hash_token(raw))
    assert (token.name, role_of(token.user)) == ("ci", "operator")
    entry = AuditEntry.objects.get(action="token.issue")
    assert entry.details == {"user": "integration", "role": "operator"}
    assert raw not in str(entry.__dict__)


def test_an_unknown_role_is_refused_and_nothing_is_written():
    with pytest.raises(DomainError, match="unknown role"):
        do_issue_token(None, "integration", "root", now=timezone.now())
    assert not ApiToken.objects.exists()
