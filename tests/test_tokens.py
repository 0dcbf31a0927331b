"""Issuing a token goes through its action: the user gets the role, the token is stored as a digest, and the
audit feed says so."""

from __future__ import annotations

import pytest
from django.utils import timezone

from slotkeeper.auth import authenticate_token
from slotkeeper.domain import DomainError
from slotkeeper.models import ApiToken, AuditEntry, hash_token
from slotkeeper.roles import has_role, role_of
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


@pytest.mark.parametrize(
    ("groups", "staff", "role"),
    [(["viewer", "operator"], False, "operator"), (["admin", "viewer"], False, "admin"), ([], True, "viewer"),
     ([], False, None)],
)  # fmt: skip
def test_a_token_check_reads_token_user_and_role_in_one_query(django_assert_num_queries, groups, staff, role):
    from django.contrib.auth.models import Group, User

    user = User.objects.create(username="multi", is_staff=staff)
    user.groups.set([Group.objects.get_or_create(name=name)[0] for name in groups])
    do_issue_token(None, "other", "viewer", now=timezone.now())  # a second user's token beside it
    raw = "skt_" + "x" * 40
    ApiToken.objects.create(user=user, digest=hash_token(raw))
    with django_assert_num_queries(1):
        principal, token = authenticate_token(raw)
        assert role_of(principal) == role
        assert has_role(principal, "viewer") is (role is not None)
    assert principal == user and token.user_id == user.pk


def test_a_revoked_token_or_an_inactive_user_does_not_authenticate():
    raw = do_issue_token(None, "gone", "operator", now=timezone.now())
    token = ApiToken.objects.get(digest=hash_token(raw))
    assert authenticate_token(raw) is not None
    token.user.is_active = False
    token.user.save()
    assert authenticate_token(raw) is None
    token.user.is_active = True
    token.user.save()
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    assert authenticate_token(raw) is None


def test_a_token_check_compiles_its_statement_once_and_reads_rows_as_the_orm_does():
    from unittest.mock import patch

    from django.contrib.auth.models import User
    from django.db.models.sql.compiler import SQLCompiler

    raw = do_issue_token(None, "reader", "operator", now=timezone.now(), name="ro")
    ApiToken.objects.filter(digest=hash_token(raw)).update(last_used_at=timezone.now())
    authenticate_token(raw)  # compiled here, if no earlier test did
    with patch.object(SQLCompiler, "as_sql", side_effect=AssertionError("compiled again")):
        principal, token = authenticate_token(raw)
    stored = ApiToken.objects.select_related("user").get(digest=hash_token(raw))
    fields = [f.attname for f in ApiToken._meta.concrete_fields]
    assert [getattr(token, f) for f in fields] == [getattr(stored, f) for f in fields]
    user_fields = [f.attname for f in User._meta.concrete_fields]
    assert [getattr(principal, f) for f in user_fields] == [getattr(stored.user, f) for f in user_fields]
    assert token.last_used_at.tzinfo is not None and token.user is principal
    assert not token._state.adding and not principal._state.adding
