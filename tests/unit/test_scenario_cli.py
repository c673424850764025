"""Scenario files and the `dqoes experiment` command: good input runs, bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.main import main
from shared.scenarios.builtin import BUILTINS
from shared.scenarios.spec import ScenarioError, load_scenario_file, parse_scenario
from shared.scenarios.training import TRAINING_BUILTINS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "two-nodes.toml"

GOOD = {
    "name": "t",
    "duration_s": 300,
    "nodes": [{"name": "n1", "cores": 2}],
    "containers": [{"name": "a", "model": "resnet50", "objective_s": 30}],
}


def with_(path, value):
    d = json.loads(json.dumps(GOOD))
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return d


@pytest.mark.parametrize(
    "doc, field",
    [
        (with_(["duration_s"], KeyError), "duration_s: missing required field"),
        (with_(["containers", 0, "model"], KeyError), "containers[0].model: missing required field"),
        (with_(["containers", 0, "objective_s"], -5), "containers[0].objective_s: must be > 0"),
        (with_(["containers", 0, "objective_s"], 0), "containers[0].objective_s: must be > 0"),
        (with_(["containers", 0, "objective_s"], "fast"), "containers[0].objective_s: must be a number"),
        (with_(["containers", 0, "model"], "resnet5O"), "containers[0].model: unknown model 'resnet5O'"),
        (with_(["containers", 0, "cpus"], 8), "containers[0].cpus: 8 cores requested but the largest node has only 2"),
        (with_(["containers", 0, "node"], "n9"), "containers[0].node: unknown node 'n9'"),
        (with_(["containers", 0, "objetive_s"], 3), "containers[0].objetive_s: unknown field"),
        (with_(["nodes", 0, "cores"], 0), "nodes[0].cores: must be > 0"),
        (with_(["nodes"], []), "nodes: must be a non-empty list"),
        (with_(["controller"], {"alpha": 2}), "controller: alpha must be a number in (0, 1)"),
        (with_(["containers", 0, "submit_at_s"], 500), "containers[0].submit_at_s: 500.0 is not before the end"),
    ],
)
def test_bad_scenarios_name_the_field(doc, field):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(doc)
    assert field in str(e.value)
    assert "\n" not in str(e.value)


def test_pinned_cpus_beyond_the_node():
    doc = with_(["containers", 0, "node"], "n1")
    doc["containers"][0]["cpus"] = 3
    with pytest.raises(ScenarioError, match=r"containers\[0\].cpus: 3 cores requested but node n1 has only 2"):
        parse_scenario(doc)


def test_example_file_loads_and_generates_reproducibly():
    a = load_scenario_file(EXAMPLE, seed=1)
    b = load_scenario_file(EXAMPLE, seed=1)
    assert a == b and len(a.containers) == 9
    assert a.profiles["tiny-cnn"].overhead_s == 0.2
    assert a.containers[2].node == "node-b" and a.containers[2].duration_s == 400


def test_json_scenarios_too(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(GOOD))
    assert load_scenario_file(p).containers[0].objective_s == 30


def test_run_json_last_line(capsys, tmp_path):
    assert main(["experiment", "run", "paper-varied", "--policy", "dqoes", "--seed", "1",
                 "--json", "--out", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    obj = json.loads(last)
    for key in ("scenario", "policy", "seed", "containers", "nodes", "satisfied_final", "satisfied_per_node",
                "oracle_satisfied", "converged_round", "rounds", "sim_duration_s", "ceiling_met", "ceiling_in_band",
                "oracle_noise_met", "oracle_noise_in_band", "oracle_noise_met_median", "oracle_noise_in_band_median",
                "expected_met_final", "expected_in_band_final"):
        assert key in obj
    assert obj["expected_in_band_final"] <= obj["ceiling_in_band"] + 1e-3
    assert isinstance(obj["satisfied_per_node"], dict)
    assert obj["oracle_noise_in_band"] <= obj["ceiling_in_band"] + 1e-6
    assert obj["oracle_noise_met"] <= obj["ceiling_met"] + 1e-6
    rows = [json.loads(x) for x in (tmp_path / "paper-varied_dqoes_seed1.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "meta" and rows[-1]["kind"] == "result"
    assert {r["kind"] for r in rows} == {"meta", "round", "container", "result"}


def test_run_text_names_the_oracle_under_noise(capsys):
    assert main(["experiment", "run", "paper-varied", "--policy", "learned", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "oracle under this run's noise: met " in out and "in band expected" in out
    assert "its final limits, as chances of each container's next batch: met " in out


def test_compare_and_list_json(capsys):
    assert main(["experiment", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["scenarios"]
    names = [s["name"] for s in rows if s["kind"] == "inference"]
    assert names == list(BUILTINS) and "paper-cluster-40" in names and "random-cluster-40" in names
    assert [s["name"] for s in rows if s["kind"] == "training"] == list(TRAINING_BUILTINS)
    assert main(["experiment", "compare", "paper-identical-achievable", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert obj["policies"]["dqoes"]["satisfied_final"] == 10


def cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, **kw)


@pytest.mark.parametrize(
    "content, needle",
    [
        ('duration_s = 100\n[[nodes]]\nname="n"\ncores=2\n[[containers]]\nname="a"\nobjective_s=3\n',
         "containers[0].model: missing required field"),
        ('duration_s = 100\n[[nodes]]\nname="n"\ncores=2\n[[containers]]\nname="a"\nmodel="resnet50"\nobjective_s=-3\n',
         "containers[0].objective_s: must be > 0"),
        ('duration_s = 100\n[[nodes]]\nname="n"\ncores=2\n[[containers]]\nname="a"\nmodel="gpt9"\nobjective_s=3\n',
         "containers[0].model: unknown model 'gpt9'"),
        ('duration_s = 100\n[[nodes]]\nname="n"\ncores=2\n[[containers]]\nname="a"\nmodel="resnet50"\nobjective_s=3\ncpus=64\n',
         "containers[0].cpus: 64 cores requested"),
        ("this is = = not toml", "not valid TOML"),
    ],
)
def test_cli_bad_file_is_one_line_and_exit_2(tmp_path, content, needle):
    p = tmp_path / "bad.toml"
    p.write_text(content)
    r = cli("experiment", "run", str(p))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_cli_unknown_scenario_and_missing_file():
    r = cli("experiment", "run", "paper-nonsense")
    assert r.returncode == 2 and "unknown scenario" in r.stderr and "Traceback" not in r.stderr
    r = cli("experiment", "run", "/nonexistent/x.toml")
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_every_command_has_help():
    for args in (["--help"], ["experiment", "--help"], ["experiment", "run", "--help"],
                 ["experiment", "compare", "--help"], ["experiment", "report", "--help"],
                 ["experiment", "list", "--help"], ["up", "--help"], ["status", "--help"],
                 ["target", "set", "--help"], ["watch", "--help"]):
        r = cli(*args)
        assert r.returncode == 0 and "usage:" in r.stdout


@pytest.mark.parametrize("service", ["services.worker", "services.manager", "services.inference"])
def test_every_service_has_help(service):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", service, "--help"], capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0 and "usage:" in r.stdout and "[env DQOES_NATS_URL]" in r.stdout


def test_scenarios_round_trip_through_their_file_form(tmp_path):
    from shared.scenarios.builtin import BUILTINS
    from shared.scenarios.spec import scenario_to_dict

    for name, make in BUILTINS.items():
        sc = make(3)
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(scenario_to_dict(sc)))
        back = load_scenario_file(p)
        assert back == sc, name
