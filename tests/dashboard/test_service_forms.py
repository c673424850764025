"""The objective form for services and percentiles: checked as the manager checks, and the stored
objectives shown with their kind."""

from __future__ import annotations

import orjson
import pytest

from dashboard import forms
from shared.public import parse_target


@pytest.mark.parametrize(("fields", "body"), [
    ({"service": "api", "objective": "0.2", "percentile": "95", "window_s": "30"},
     {"service": "api", "objective": 0.2, "percentile": 95.0, "window_s": 30.0}),
    ({"service": " app=api ", "objective": "0.25"}, {"service": "app=api", "objective": 0.25}),
    ({"container": "c1", "objective": "0.1", "percentile": "99"},
     {"container": "c1", "objective": 0.1, "percentile": 99.0}),
])
def test_a_service_or_percentile_objective_is_a_request_the_manager_accepts(fields, body):
    r = forms.validate_target(fields.get("container", ""), fields["objective"], "",
                              service=fields.get("service", ""), percentile=fields.get("percentile", ""),
                              window_s=fields.get("window_s", ""))
    assert r.ok and r.body == body, r.error
    req = parse_target(orjson.dumps(r.body))
    assert (req.service, req.percentile) == (body.get("service"), body.get("percentile"))


@pytest.mark.parametrize(("fields", "words"), [
    ({"service": "api", "container": "c1"}, "not both"),
    ({}, "container: required"),
    ({"service": "a b"}, "service: must be a service name"),
    ({"service": "api", "percentile": "100"}, "percentile: must be a percentile in (0, 100)"),
    ({"service": "api", "percentile": "abc"}, "percentile: 'abc' is not a number"),
    ({"service": "api", "percentile": "95", "window_s": "0"}, "window_s"),
    ({"service": "api", "window_s": "30"}, "needs a percentile"),
])
def test_bad_service_or_percentile_fields_give_one_message_and_no_request(fields, words):
    r = forms.validate_target(fields.get("container", ""), "0.2", "", service=fields.get("service", ""),
                              percentile=fields.get("percentile", ""), window_s=fields.get("window_s", ""))
    assert not r.ok and r.body is None and words in (r.error or ""), r.error
    sent = []
    replies = forms.submit(fields.get("container", ""), "0.2", "", ["dqoes"], lambda *a: sent.append(a) or {},
                           service=fields.get("service", ""), percentile=fields.get("percentile", ""),
                           window_s=fields.get("window_s", ""))
    assert sent == [] and replies[0][1]["answered"] is False


def test_clearing_a_service_sends_its_selector():
    assert forms.validate_clear("", "app=api").body == {"service": "app=api"}
    assert "service" in (forms.validate_clear("", "a b").error or "")


def test_stored_objectives_show_their_kind_and_where_they_apply():
    rows = forms.targets_rows([
        {"service": "api", "container": None, "objective_s": 0.2, "alpha": None, "percentile": 95,
         "window_s": 30, "revision": 4, "containers": ["api.1.a", "api.2.b"]},
        {"container": "c1", "objective_s": 40.0, "alpha": 0.1, "node": "n1", "running": True, "revision": 2},
    ])
    assert rows[0] == {"for": "api", "objective": "p95 0.2 s over 30 s", "alpha": "default", "from": "service",
                       "where": "2 container(s): api.1.a, api.2.b", "revision": 4}
    assert rows[1] == {"for": "c1", "objective": "40 s a batch", "alpha": "0.1", "from": "container",
                       "where": "running on n1", "revision": 2}
    assert forms.describe_reply({"ok": True, "service": "api", "objective_s": 0.2, "percentile": 95,
                                 "window_s": 30, "revision": 4, "containers": ["api.1.a"]}).startswith(
        "objective for service api: p95 0.2 s over 30 s (governs 1 container(s)")
