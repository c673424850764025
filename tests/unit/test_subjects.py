"""Subjects: kind before ids, ids validated, '.' in names survives as '~' and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import subjects


def test_builders_put_the_kind_before_the_ids():
    assert subjects.latency("n1", "c01") == "dqoes.latency.n1.c01"
    assert subjects.latency_of_node("n1") == "dqoes.latency.n1.*"
    assert subjects.decisions("n1") == "dqoes.decisions.n1"
    assert subjects.state("n1") == "dqoes.state.n1"
    assert subjects.objectives("n1") == "dqoes.objectives.n1"
    assert subjects.control("n1") == "dqoes.control.n1"
    assert subjects.STATE_ALL == "dqoes.state.*"
    assert subjects.DECISIONS_ALL == "dqoes.decisions.*"
    assert subjects.CLUSTER_STATE == "dqoes.cluster.state"
    assert subjects.TARGETS == "dqoes.targets"


def test_dots_in_names_become_tilde_in_one_token():
    subject = subjects.latency("host.example.org", "web.1")
    assert subject == "dqoes.latency.host~example~org.web~1"
    assert len(subject.split(".")) == 4
    assert subjects.parse(subject) == ("latency", ("host.example.org", "web.1"))


@pytest.mark.parametrize(
    "subject, parsed",
    [
        ("dqoes.latency.n1.c~1", ("latency", ("n1", "c.1"))),
        ("dqoes.state.n~1", ("state", ("n.1",))),
        ("dqoes.decisions.n1", ("decisions", ("n1",))),
        ("dqoes.objectives.n1", ("objectives", ("n1",))),
        ("dqoes.control.n1", ("control", ("n1",))),
        ("dqoes.targets", ("targets", ())),
        ("dqoes.cluster.state", ("cluster.state", ())),
        ("dqoes.cluster.query", ("cluster.query", ())),
    ],
)
def test_parse_reads_back_every_kind(subject, parsed):
    assert subjects.parse(subject) == parsed


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "dqoes",
        "other.latency.n1.c1",
        "dqoes.latency.n1",
        "dqoes.state.n1.extra",
        "dqoes.nope.n1",
    ],
)
def test_parse_rejects_foreign_subjects(subject):
    with pytest.raises(ValueError, match="not a dqoes subject"):
        subjects.parse(subject)


# Docker names: [a-zA-Z0-9][a-zA-Z0-9_.-]*; host names add nothing new; ids are hex.
docker_names = st.from_regex(r"\A[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}\Z")
printable_ids = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp", "Co", "Cn", "Cf")),
    min_size=1,
    max_size=200,
).filter(lambda s: not set(s) & set("*>~") and s.isprintable() and not any(c.isspace() for c in s))


@given(st.one_of(docker_names, printable_ids))
def test_token_round_trips_and_never_contains_a_separator(name):
    tok = subjects.token(name)
    assert "." not in tok and "*" not in tok and ">" not in tok and " " not in tok
    assert subjects.untoken(tok) == name


@given(docker_names, docker_names)
def test_latency_subject_round_trips(node, container):
    assert subjects.parse(subjects.latency(node, container)) == ("latency", (node, container))


@pytest.mark.parametrize(
    "bad, why",
    [
        ("", "must not be empty"),
        ("x" * 201, "longer than 200"),
        ("a b", "whitespace"),
        ("a\tb", "whitespace"),
        ("a\nb", "whitespace"),
        ("a\x00b", "unprintable"),
        ("a*", r"'\*'"),
        ("a>", "'>'"),
        ("a~b", "'~'"),
        (42, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_bad_ids_raise_valueerror_naming_the_id(bad, why):
    for build in (
        lambda x: subjects.latency("n1", x),
        lambda x: subjects.latency(x, "c1"),
        subjects.state,
        subjects.decisions,
        subjects.objectives,
        subjects.control,
        subjects.latency_of_node,
    ):
        with pytest.raises(ValueError, match=why) as info:
            build(bad)
        if isinstance(bad, str) and bad and len(bad) < 50:
            assert repr(bad) in str(info.value)


def test_errors_say_which_id_is_wrong():
    with pytest.raises(ValueError, match=r"^container 'a b'"):
        subjects.latency("n1", "a b")
    with pytest.raises(ValueError, match=r"^node 'n 1'"):
        subjects.latency("n 1", "c1")


def test_exactly_200_characters_is_fine():
    assert subjects.state("n" * 200).endswith("n" * 200)


@pytest.mark.parametrize("tok", ["a.b", "", "a b", "a*"])
def test_untoken_rejects_what_no_token_can_be(tok):
    with pytest.raises(ValueError):
        subjects.untoken(tok)


def test_kv_keys_take_docker_names_and_refuse_others():
    assert subjects.kv_key("web.1") == "web.1"
    assert subjects.kv_key("3f2a9c") == "3f2a9c"
    for bad in ("é", "a:b", ".a", "a..b", "a~b", ""):
        with pytest.raises(ValueError):
            subjects.kv_key(bad)
