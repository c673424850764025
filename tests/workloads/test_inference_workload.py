"""The batch loop and the standalone runner, on MobileNetV2 at 64 px (milliseconds a batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from services.inference import run  # noqa: E402
from services.inference.cgroup import available_cpus  # noqa: E402
from services.inference.jemalloc import find_jemalloc  # noqa: E402
from services.inference.models import ALIASES, MODELS  # noqa: E402
from services.inference.workload import (  # noqa: E402
    BatchResult,
    Workload,
    WorkloadError,
    load_images,
)

REPO = Path(__file__).resolve().parents[2]
SMALL = {"model": "mobilenetv2", "batch_size": 3, "resolution_px": 64}


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_results_per_batch():
    results = list(Workload(**SMALL, limit_reader=lambda: None).run(batches=3))
    assert [r.batch for r in results] == [0, 1, 2]
    assert [r.warmup for r in results] == [True, False, False]
    for r in results:
        assert isinstance(r, BatchResult)
        assert r.latency_s > 0 and r.cpu_s > 0
        assert r.images == 3 and r.resolution_px == 64 and r.model == "mobilenetv2"
        assert r.threads == 1 and r.limit_cores is None
    assert results[0].finished_at <= results[1].finished_at <= results[2].finished_at
    assert json.loads(json.dumps(results[0].to_dict()))["latency_s"] == results[0].latency_s


@pytest.mark.parametrize(("limit_cores", "threads"), [(0.5, 1), (1.5, 1), (2.5, 2), (None, 1)])
def test_threads_follow_the_limit_before_each_batch(limit_cores, threads):
    workload = Workload(**SMALL, limit_reader=lambda: limit_cores)
    (r,) = workload.run(batches=1)
    expected = min(threads, available_cpus())
    assert r.threads == expected and r.limit_cores == limit_cores
    assert torch.get_num_threads() == expected


def test_limit_changes_between_batches_and_override():
    limits = iter([2.0, 0.5])
    workload = Workload(**SMALL, limit_reader=lambda: next(limits))
    assert [r.threads for r in workload.run(batches=2)] == [min(2, available_cpus()), 1]
    pinned = Workload(**SMALL, threads=1, limit_reader=lambda: 4.0)
    assert next(pinned.run(1)).threads == 1
    unlimited = Workload(**SMALL, default_threads=2, limit_reader=lambda: None)
    assert next(unlimited.run()).threads == min(2, available_cpus())


def test_stop_ends_the_loop_after_the_current_batch():
    event = threading.Event()
    workload = Workload(**SMALL, stop_event=event, limit_reader=lambda: None)
    seen = []
    for r in workload.run():  # no batch limit
        seen.append(r)
        if len(seen) == 2:
            workload.stop()
    assert len(seen) == 2 and event.is_set()
    assert list(workload.run()) == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model": "nope"}, "unknown model"),
        ({"batch_size": 0}, "batch size"),
        ({"model": "inceptionv3", "resolution_px": 64}, "at least 75 px"),
        ({"threads": 0}, "threads"),
    ],
)
def test_bad_settings(settings, message):
    with pytest.raises(WorkloadError, match=message):
        Workload(**{**SMALL, **settings})


def _ppm(width: int, height: int, value: int) -> bytes:
    header = b"P6\n# a comment\n%d %d\n255\n" % (width, height)
    return header + bytes([value]) * (width * height * 3)


def test_images_from_a_directory(tmp_path):
    np.save(tmp_path / "a.npy", np.full((40, 30, 3), 255, dtype=np.uint8))  # HWC uint8
    torch.save(torch.zeros(2, 3, 64, 64), tmp_path / "b.pt")  # NCHW float, used as is
    (tmp_path / "c.ppm").write_bytes(_ppm(8, 6, 0))
    (tmp_path / "notes.txt").write_text("ignored")
    images = load_images(tmp_path, batch_size=6, resolution_px=64)
    assert images.shape == (6, 3, 64, 64)
    white = (1 - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    assert torch.allclose(images[0].mean(dim=(1, 2)), white, atol=1e-5)
    assert torch.equal(images[1], torch.zeros(3, 64, 64))
    assert images[3].mean() < 0  # black PPM, normalised
    assert torch.equal(images[4], images[0])  # cycled to fill the batch
    (r,) = Workload(**SMALL, images_dir=tmp_path, limit_reader=lambda: None).run(1)
    assert r.images == 3


def test_image_directory_errors(tmp_path):
    with pytest.raises(WorkloadError, match="does not exist"):
        load_images(tmp_path / "absent", 2, 64)
    with pytest.raises(WorkloadError, match="no .npy"):
        load_images(tmp_path, 2, 64)
    (tmp_path / "x.ppm").write_bytes(b"P3\n1 1\n255\n0 0 0\n")
    with pytest.raises(WorkloadError, match="binary PPM"):
        load_images(tmp_path, 2, 64)


# --------------------------------------------------------------------------- run.py

RUN_SMALL = ["--model", "nasnetmobile", "--batch", "2", "--resolution", "64", "--batches", "2"]


def test_run_prints_one_json_object_per_batch(capsys):
    assert run.main([*RUN_SMALL, "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["batch"] for r in rows] == [0, 1]
    assert rows[0]["warmup"] is True and rows[0]["model"] == "mobilenetv2"
    assert rows[1]["images"] == 2 and rows[1]["latency_s"] > 0 and rows[1]["cpu_s"] > 0


def test_run_human_output(capsys):
    assert run.main([*RUN_SMALL, "--threads", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "latency" in out[0] and "warm-up" in out[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["--batch", "0"],
        ["--batches", "x"],
        ["--model", "nope", "--batches", "1"],
        ["--model", "inceptionv3", "--resolution", "64", "--batches", "1"],
        ["--model", "mobilenetv2", "--weights", "/nonexistent.pt", "--batches", "1"],
        ["--unknown"],
    ],
)
def test_run_bad_arguments_are_one_line_and_exit_2(capsys, argv):
    try:
        status = run.main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "error:" in captured.err


def test_run_help_names_every_model():
    names = {w.strip(",()") for w in run.MODEL_HELP.split()}
    assert set(MODELS) | set(ALIASES) <= names


def test_run_as_a_module_under_jemalloc():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "DQOES_NO_JEMALLOC")}
    proc = subprocess.run(
        [sys.executable, "-m", "services.inference.run", *RUN_SMALL[:-1], "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    allocator = "jemalloc" if find_jemalloc() else "default malloc"
    assert f"allocator {allocator}" in proc.stderr
