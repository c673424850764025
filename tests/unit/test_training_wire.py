"""Training subjects, the submit request and bad progress bytes (no network)."""

from __future__ import annotations

import math

import msgpack
import pytest

from shared import public, schema, subjects
from shared.schema import Progress, SchemaError


def test_training_subjects_and_parse():
    assert subjects.progress("n1", "job.1") == "dqoes.progress.n1.job~1"
    assert subjects.progress_of_node("n1") == "dqoes.progress.n1.*"
    assert subjects.training("n1") == "dqoes.training.n1"
    assert subjects.launch("n1") == "dqoes.launch.n1"
    assert subjects.SUBMIT == "dqoes.submit"
    assert subjects.parse("dqoes.progress.n1.job~1") == ("progress", ("n1", "job.1"))
    assert subjects.parse("dqoes.training.n1") == ("training", ("n1",))
    assert subjects.parse("dqoes.launch.n1") == ("launch", ("n1",))
    assert subjects.parse("dqoes.submit") == ("submit", ())
    with pytest.raises(ValueError):
        subjects.progress("n 1", "j")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, None, "x"])
def test_progress_with_a_bad_value_does_not_decode(value):
    good = msgpack.unpackb(schema.encode(Progress(job="j", node="n", value=1.0, epoch=0), "t", 1.0), raw=False)
    good["value"] = value
    with pytest.raises(SchemaError, match="value"):
        schema.decode(msgpack.packb(good, use_bin_type=True))
    del good["value"]
    with pytest.raises(SchemaError, match="value"):
        schema.decode(msgpack.packb(good, use_bin_type=True))


def test_a_job_cannot_build_or_send_a_bad_progress():
    with pytest.raises(SchemaError):
        Progress.build(job="j", node="n", value=math.nan, epoch=0)
    with pytest.raises(SchemaError, match="value"):
        schema.encode(Progress(job="j", node="n", value=math.nan, epoch=0), "j")


def test_submit_request():
    r = public.parse_submit(b'{"model": "gru", "epochs": 40, "node": "w2"}')
    assert (r.model, r.epochs, r.node, r.name) == ("gru", 40, "w2", None)
    assert public.parse_submit(r.to_json()) == r
    assert public.parse_submit(msgpack.packb({"model": "vae"})).model == "vae"
    for bad, why in [(b"", "empty"), (b"{}", "model"), (b'{"model": "cnn", "epochs": 0}', "epochs"),
                     (b'{"model": "cnn", "epochs": 1000001}', "epochs"), (b'{"model": 3}', "model"),
                     (b'{"model": "cnn", "gpu": 1}', "unknown field"), (b"[]", "object"),
                     (b'{"model": "cnn", "node": "a b"}', "node")]:
        with pytest.raises(SchemaError, match=why):
            public.parse_submit(bad)
