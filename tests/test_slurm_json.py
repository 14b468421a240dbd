"""Pure tests of the Slurm JSON parsing and the idle rule (offcut.slurm_plugin.slurm_json):
recorded ``sinfo --json`` / ``squeue --json`` / ``sacct`` answers of the Slurm 22.05 test cluster
(tests/data/slurm, captured from the real cluster of tests/slurm_cluster.py), hand-made answers
in the shapes of later Slurm versions, and garbage. No Slurm needed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from offcut.slurm_plugin.nodelist import (NodeListError, compress, expand_nodelist,
                                          split_valid)
from offcut.slurm_plugin.slurm_json import (JobInfo, NodeInfo, OwnJobRule, SlurmDataError,
                                            gpu_count, idle_nodes, number, parse_jobs,
                                            parse_nodes, parse_sacct, state_tokens)

DATA = Path(__file__).resolve().parent / "data" / "slurm"
SCAV = frozenset({"scavenger"})


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def view(sinfo: str | dict, squeue: str | dict | None = None, rule: OwnJobRule = OwnJobRule(),
         parts=SCAV, ignore=()):
    nodes = parse_nodes(load(sinfo) if isinstance(sinfo, str) else sinfo)
    jobs = parse_jobs(load(squeue) if isinstance(squeue, str) else squeue) if squeue else []
    return idle_nodes(nodes, jobs, rule, node_partitions=parts, ignore_job_ids=ignore)


# ----------------------------------------------------------------------------- hostlists
def test_expand_nodelist():
    assert expand_nodelist("n[1-3]") == ["n1", "n2", "n3"]
    assert expand_nodelist(" r[1-2]n[01-02],x ") == ["r1n01", "r1n02", "r2n01", "r2n02", "x"]
    assert expand_nodelist("n1,n1") == ["n1"]
    assert compress(["n1", "n2", "n4"]) == "n[1-2,4]"


@pytest.mark.parametrize("text", [None, "", "   ", "n[1-", "n[3-1]", "]]", "n[1-99999999]",
                                  "a[1-1000],b[1-1000]" * 300])
def test_expand_nodelist_refuses_garbage(text):
    with pytest.raises(NodeListError):
        expand_nodelist(text, max_nodes=100_000)


def test_split_valid_uses_the_daemons_rule():
    good, bad = split_valid(["n1", "a b", "-x", "ok.node_1", "x" * 129, "ü"])
    assert good == ["n1", "ok.node_1"]
    assert len(bad) == 4


# ----------------------------------------------------------------------------- states
@pytest.mark.parametrize("value,expected", [
    ("idle", {"IDLE"}),
    ("idle*", {"IDLE", "NOT_RESPONDING"}),
    ("idle~", {"IDLE", "POWERED_DOWN"}),
    ("mix#", {"MIXED", "POWERING_UP"}),
    ("idle%", {"IDLE", "POWERING_DOWN"}),
    ("down*", {"DOWN", "NOT_RESPONDING"}),
    ("drng", {"DRAINING", "DRAIN"}),
    ("plnd", {"PLANNED"}),
    ("IDLE+DRAIN", {"IDLE", "DRAIN"}),
    (["IDLE", "RESERVED"], {"IDLE", "RESERVED"}),
    (["MIXED", ["COMPLETING"]], {"MIXED", "COMPLETING"}),
    (None, set()),
])
def test_state_tokens(value, expected):
    assert state_tokens(value) == expected


def test_number_shapes():
    assert number(5) == 5 and number("7") == 7 and number(None) == 0
    assert number({"set": True, "infinite": False, "number": 12}) == 12
    assert number({"set": False, "infinite": False, "number": 12}) == 0
    assert number({"set": True, "infinite": True, "number": 0}) == math.inf
    with pytest.raises(SlurmDataError):
        number("soon")


# ----------------------------------------------------------------------------- recorded 22.05
def test_recorded_idle_cluster():
    nodes = parse_nodes(load("sinfo-22.05-idle.json"))
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n1"].partitions == {"batch", "scavenger"}
    v = view("sinfo-22.05-idle.json", "squeue-22.05-completing.json")
    # the two batch jobs are COMPLETING (their epilog runs) but hold no node any more
    assert v.idle == ["n1", "n2", "n3", "n4"]


def test_recorded_drained_reserved_maintenance():
    v = view("sinfo-22.05-drain-resv-maint.json")
    assert v.idle == ["n2"]
    assert "maintenance" in v.not_idle["n1"] and "reserved" in v.not_idle["n3"]
    assert "drain" in v.not_idle["n4"] and "(test)" in v.not_idle["n4"]


def test_recorded_down_not_responding_draining():
    v = view("sinfo-22.05-down-draining.json", "squeue-22.05-down-draining.json")
    assert v.idle == ["n1"]
    assert "not_responding" in v.not_idle["n2"]
    assert "down" in v.not_idle["n3"]
    assert "drain" in v.not_idle["n4"]


def test_recorded_regular_job_configuring():
    v = view("sinfo-22.05-configuring.json", "squeue-22.05-configuring.json")
    assert v.idle == []
    assert v.not_idle["n1"].startswith("job 5 (batch)")


def test_recorded_offcut_jobs_count_as_idle_under_the_rule():
    files = ("sinfo-22.05-offcut-jobs.json", "squeue-22.05-offcut-jobs.json")
    # default: every job of the scavenger partition is Offcut's
    assert view(*files).idle == ["n1", "n2", "n3", "n4"]
    # job 3 (offcut-t1, comment "offcut") on n3, job 4 (offcut-t2, no comment) on n4
    assert view(*files, rule=OwnJobRule(comment_marker="offcut")).idle == ["n1", "n2", "n3"]
    assert view(*files, rule=OwnJobRule(name_prefix="offcut-")).idle == ["n1", "n2", "n3", "n4"]
    v = view(*files, rule=OwnJobRule(name_prefix="other-"))
    assert v.idle == ["n1", "n2"] and v.not_idle["n3"] == "job 3 (scavenger)"
    assert view(*files, rule=OwnJobRule(partitions=frozenset({"elsewhere"}))).idle == ["n1", "n2"]


def test_recorded_offcut_jobs_being_preempted_are_not_idle():
    v = view("sinfo-22.05-preempting.json", "squeue-22.05-preempting.json")
    assert v.idle == ["n1", "n2"]
    assert "being preempted" in v.not_idle["n3"] and "being preempted" in v.not_idle["n4"]


def test_node_partition_filter():
    assert view("sinfo-22.05-idle.json", parts=frozenset({"gpu"})).idle == []
    assert view("sinfo-22.05-idle.json", parts=frozenset()).idle == ["n1", "n2", "n3", "n4"]


def test_recorded_jobs():
    jobs = {j.job_id: j for j in parse_jobs(load("squeue-22.05-preempting.json"))}
    assert jobs["3"].nodes == ("n3",) and jobs["3"].being_preempted and jobs["3"].holds_nodes
    assert jobs["1"].states == {"COMPLETED"} and not jobs["1"].holds_nodes  # finished
    assert jobs["5"].states == {"PENDING"} and not jobs["5"].holds_nodes


def test_recorded_gpu_node_and_features():
    """The 22.05 test cluster with SLURM_GPU_NODES=n2 SLURM_NODE_FEATURES='n2=a100,ib'
    (tests/slurm/start-slurm.sh): job 1 (scavenger, --gpus-per-node=1 --constraint=a100) runs
    on n2, job 2 (batch) on n1, job 3 (scavenger, --gres=gpu:1) waits for the GPU."""
    nodes = parse_nodes(load("sinfo-22.05-gres.json"))
    assert nodes["n2"].gpus == 1 and nodes["n2"].features == ("a100", "ib")
    assert nodes["n1"].gpus == 0 and nodes["n1"].features == ()  # gres "", gres_used "gpu:0"
    assert nodes["n2"].states == {"MIXED"} and nodes["n2"].partitions == {"batch", "scavenger"}
    jobs = {j.job_id: j for j in parse_jobs(load("squeue-22.05-gres.json"))}
    assert jobs["1"].nodes == ("n2",) and jobs["1"].partition == "scavenger"
    assert jobs["3"].states == {"PENDING"} and not jobs["3"].holds_nodes
    v = view("sinfo-22.05-gres.json", "squeue-22.05-gres.json")
    assert v.idle == ["n2"] and v.not_idle == {"n1": "job 2 (batch)"}


def test_recorded_files_without_gres_have_no_gpus_or_features():
    for name in sorted(DATA.glob("sinfo-22.05-*.json")):
        if "gres" not in name.name:
            for node in parse_nodes(load(name.name)).values():
                assert node.gpus == 0 and node.features == (), (name.name, node)


@pytest.mark.parametrize("gres,expected", [
    ("gpu:1", 1),
    ("gpu:a100:4", 4),
    ("gpu:a100:4(S:0-1)", 4),
    ("gpu:a100:2(S:0,2)", 2),  # a comma inside the socket list
    ("gpu:2,mps:100", 2),
    ("mps:100,gpu:tesla:2(S:0)", 2),
    ("gpu:a100:2,gpu:v100:1", 3),  # summed over types
    ("gpu:nvidia_a100-sxm4-80gb:8(S:0-1),shard:32", 8),  # AutoDetect type names
    ("gpu:1g.10gb:7", 7),  # MIG types start with a digit
    ("gpu:a100:0(IDX:N/A)", 0),  # gres_used of an idle node
    ("gpu", 1), ("gpu:a100", 1),  # no count: 1, as in slurm.conf
    ("gpu:1K", 1024),
    ("mps:100", 0), ("bandwidth:lustre:4G", 0),
    ("(null)", 0), ("", 0), ("  ", 0), ("N/A", 0), (None, 0),
])
def test_gpu_count(gres, expected):
    assert gpu_count(gres) == expected


@pytest.mark.parametrize("gres,message", [
    ("gpu:a100:x", "count 'x' is not a number"),
    ("gpu:1.5", "not a number"),
    ("gpu:-1", "not a number"),
    ("gpu:4x", "not a number"),
    ("gpu:", "not a number"),
    ("gpu:a100:", "not a number"),
    ("gpu:a:b:c", "not name\\[:type\\]\\[:count\\]"),
    (":1", "bad name"),
    ("gpu:1,,mps:2", "is not name"),
    ("gpu:a b:1", "bad type"),
    ("gpu:1(S:0", "unbalanced"),
    ("gpu:1)", "unbalanced"),
    ("gpu:1(S:0)x", "text after"),
    ("gpu:1(S:(0))", "nested"),
    (4, "not a string"),
    (["gpu:1"], "not a string"),
])
def test_gpu_count_garbage(gres, message):
    with pytest.raises(SlurmDataError, match=message):
        gpu_count(gres)


# ----------------------------------------------------------------------------- other versions
V0039_NODES = {  # Slurm 23.02 style: state is a list, no state_flags, numbers as objects
    "nodes": [
        {"name": "a1", "state": ["IDLE"], "partitions": ["scavenger"]},
        {"name": "a2", "state": ["IDLE", "DRAIN"], "partitions": ["scavenger"]},
        {"name": "a3", "state": ["MIXED"], "partitions": ["scavenger"]},
        {"name": "a4", "state": ["IDLE", "PLANNED"], "partitions": ["scavenger"]},
        {"name": "a5", "state": ["IDLE", "POWERED_DOWN"], "partitions": ["scavenger"]},
        {"name": "a6", "state": ["IDLE", "CLOUD"], "partitions": ["scavenger"]},
        {"name": "a7", "state": ["ALLOCATED", "COMPLETING"], "partitions": ["scavenger"]},
    ],
    "errors": [], "warnings": [],
}
V0040_JOBS = {
    "jobs": [
        {"job_id": 7, "name": "offcut-x", "partition": "scavenger", "job_state": ["RUNNING"],
         "nodes": "a3", "preempt_time": {"set": True, "infinite": False, "number": 0},
         "comment": ""},
        {"job_id": 8, "name": "user", "partition": "batch", "job_state": ["COMPLETING"],
         "nodes": "a7", "preempt_time": {"set": False, "infinite": False, "number": 0}},
    ],
    "errors": [], "warnings": [],
}


def test_list_states_and_object_numbers():
    v = view(V0039_NODES, V0040_JOBS)
    assert v.idle == ["a1", "a3", "a6"]  # a3: busy only with Offcut's job 7
    assert set(v.not_idle) == {"a2", "a4", "a5", "a7"}
    assert "planned" in v.not_idle["a4"] and "powered_down" in v.not_idle["a5"]
    assert v.not_idle["a7"] == "job 8 (batch)"
    # the epilog disregards its own ending job: a7 is then idle (completing, nobody else on it)
    assert "a7" in view(V0039_NODES, V0040_JOBS, ignore=["8"]).idle


def test_grouped_sinfo_of_later_versions():
    doc = {"sinfo": [
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["c1", "c2"], "total": 2},
         "partition": {"name": "scavenger"}},
        {"node": {"state": ["IDLE", "DRAIN"]}, "nodes": {"nodes": ["c3"]},
         "partition": {"name": "scavenger"}, "reason": {"description": "bad dimm"}},
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["c1", "c2"]}, "partition": {"name": "batch"}},
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": "c[4-5]"}, "partition": {"name": "batch"}},
    ], "errors": [], "warnings": []}
    nodes = parse_nodes(doc)
    assert nodes["c1"].partitions == {"scavenger", "batch"}
    v = idle_nodes(nodes, [], OwnJobRule(), node_partitions=SCAV)
    assert v.idle == ["c1", "c2"]
    assert v.not_idle["c3"] == "drain (bad dimm)"
    assert v.not_idle["c4"].startswith("not in partition")


def test_gpus_and_features_of_later_versions():
    """23.02+ node records (scontrol/slurmrestd, v0.0.39-v0.0.41): features as lists, gres a
    string; pyslurm: gres a list, features_active; 23.11+ grouped sinfo rows: nested
    features/gres objects, one row per partition."""
    doc = {"nodes": [
        {"name": "g1", "state": ["IDLE"], "gres": "gpu:a100:4(S:0-1)",
         "features": ["a100", "ib"], "active_features": ["a100", "ib"]},
        {"name": "g2", "state": ["IDLE"], "gres": "gpu:a100:2(S:0),gpu:v100:2(S:1),mps:200",
         "features": ["knl", "quad", "flat"], "active_features": ["knl", "quad"]},
        {"name": "g3", "state": ["IDLE"], "gres": "", "features": ["x"], "active_features": []},
        {"name": "g4", "state": ["IDLE"], "gres": "(null)", "features": "a,b,a"},  # no active
        {"name": "g5", "state": "IDLE", "gres": ["gpu:tesla:2", "mps:200"],  # pyslurm
         "features": ["tesla"], "features_active": ["tesla"]},
        {"name": "g6", "state": ["IDLE"]},  # neither said
    ]}
    nodes = parse_nodes(doc)
    assert [(n, nodes[n].gpus, nodes[n].features) for n in sorted(nodes)] == [
        ("g1", 4, ("a100", "ib")), ("g2", 4, ("knl", "quad")), ("g3", 0, ()),
        ("g4", 0, ("a", "b")), ("g5", 2, ("tesla",)), ("g6", 0, ())]

    grouped = {"sinfo": [
        {"node": {"state": ["MIXED"]}, "nodes": {"nodes": ["h1", "h2"]},
         "partition": {"name": "scavenger"},
         "gres": {"total": "gpu:h100:8(S:0-1)", "used": "gpu:h100:2(IDX:0-1)"},
         "features": {"total": "h100,nvlink", "active": "h100,nvlink"}},
        {"node": {"state": ["MIXED"]}, "nodes": {"nodes": ["h1", "h2"]},
         "partition": {"name": "batch"},
         "gres": {"total": "gpu:h100:8(S:0-1)", "used": "gpu:h100:2(IDX:0-1)"},
         "features": {"total": "h100,nvlink", "active": "h100,nvlink"}},
        {"node": {"state": ["IDLE"]}, "nodes": {"nodes": ["c1"]}, "partition": {"name": "batch"},
         "gres": {"total": "", "used": ""}, "features": {"total": "cpu", "active": None}},
    ]}
    nodes = parse_nodes(grouped)
    assert nodes["h1"].gpus == 8 and nodes["h1"].features == ("h100", "nvlink")
    assert nodes["h1"].partitions == {"scavenger", "batch"}
    assert nodes["c1"].gpus == 0 and nodes["c1"].features == ("cpu",)  # active None: total


def test_short_form_states():
    doc = {"nodes": [{"name": f"b{i}", "state": s} for i, s in enumerate(
        ["idle*", "idle~", "mix#", "idle%", "drng", "idle", "plnd", "IDLE+DRAIN", "alloc",
         "idle+COMPLETING", "idle$", "idle@", "resv", "maint", "unk", "futr"])]}
    v = idle_nodes(parse_nodes(doc), [], OwnJobRule())
    assert v.idle == ["b5", "b9"]
    assert v.not_idle["b8"] == "allocated, but no job seen on it"


def test_job_node_fields_of_other_versions():
    doc = {"jobs": [
        {"job_id": 1, "job_state": "RUNNING", "job_resources": {"nodes": "x[1-2]"}},
        {"job_id": 2, "job_state": ["RUNNING"], "job_resources": {"nodes": {"list": "x3"}}},
        {"job_id": 3, "job_state": "RUNNING",
         "job_resources": {"nodes": {"count": 1, "allocation": [{"name": "x4"}]}}},
        {"job_id": 4, "job_state": "RUNNING",
         "job_resources": {"allocated_nodes": [{"nodename": "x5"}]}},
        {"job_id": {"set": True, "number": 5}, "job_state": "RUNNING", "nodes": "x6",
         "comment": {"job": "offcut", "administrator": "", "system": ""}},
        {"job_id": 6, "state": "SUSPENDED", "nodes": "x7"},
    ]}
    jobs = parse_jobs(doc)
    assert [j.nodes for j in jobs] == [("x1", "x2"), ("x3",), ("x4",), ("x5",), ("x6",), ("x7",)]
    assert jobs[4].job_id == "5" and jobs[4].comment == "offcut"
    assert all(j.holds_nodes for j in jobs)


def test_unknown_state_flag_excludes_and_is_reported():
    doc = {"nodes": [{"name": "d1", "state": ["IDLE", "SOMETHING_NEW"]}, {"name": "d2", "state": "idle"}]}
    v = idle_nodes(parse_nodes(doc), [], OwnJobRule())
    assert v.idle == ["d2"]
    assert v.unknown_tokens == {"SOMETHING_NEW"}
    assert "unknown state" in v.not_idle["d1"]


def test_busy_node_without_jobs_is_not_idle_but_foreign_jobs_win():
    nodes = {"e1": NodeInfo("e1", frozenset({"ALLOCATED"})), "e2": NodeInfo("e2", frozenset({"IDLE"}))}
    jobs = [JobInfo("9", partition="batch", states=frozenset({"RUNNING"}), nodes=("e2",)),
            JobInfo("10", partition="scavenger", states=frozenset({"RUNNING"}), nodes=("e2",))]
    v = idle_nodes(nodes, jobs, OwnJobRule())
    assert v.idle == []
    assert v.not_idle == {"e1": "allocated, but no job seen on it", "e2": "job 9 (batch)"}


# ----------------------------------------------------------------------------- garbage
@pytest.mark.parametrize("doc,message", [
    ([], "not an object"),
    ("nodes", "not an object"),
    ({}, "neither a 'nodes' nor a 'sinfo' list"),
    ({"nodes": "n1"}, "neither"),
    ({"nodes": []}, "lists no node"),
    ({"nodes": [{"state": "idle"}]}, "has no name"),
    ({"nodes": [{"name": "n1"}]}, "has no state"),
    ({"nodes": [{"name": "n1", "state": 3}]}, "not a string"),
    ({"nodes": ["n1"]}, "not an object"),
    ({"nodes": [{"name": "n1", "state": "idle", "partitions": 5}]}, "partitions"),
    ({"errors": [{"error": "Unable to contact slurm controller (connect failure)"}], "nodes": []},
     "Unable to contact slurm controller"),
    ({"sinfo": [{"nodes": {"nodes": "n[1-"}, "node": {"state": ["IDLE"]}}]}, "malformed"),
    ({"nodes": [{"name": "n1", "state": "idle", "gres": "gpu:a100:x"}]},
     "node 'n1': gres item 'gpu:a100:x': count 'x' is not a number"),
    ({"nodes": [{"name": "n1", "state": "idle", "gres": 2}]}, "node 'n1': gres 2 is neither"),
    ({"nodes": [{"name": "n1", "state": "idle", "features": 5}]}, "node 'n1': features 5"),
    ({"nodes": [{"name": "n1", "state": "idle", "active_features": ["a", 1]}]},
     "node 'n1': features \\(active\\): entry 1 is not a string"),
    ({"sinfo": [{"nodes": {"nodes": ["c1"]}, "node": {"state": ["IDLE"]},
                 "gres": {"total": "gpu:(S:0)"}}]}, "node 'c1': gres item"),
])
def test_sinfo_garbage(doc, message):
    with pytest.raises(SlurmDataError, match=message):
        parse_nodes(doc)


@pytest.mark.parametrize("doc,message", [
    ([], "not an object"),
    ({"jobs": {}}, "no 'jobs' list"),
    ({"meta": {}}, "no 'jobs' list"),
    ({"jobs": [5]}, "not an object"),
    ({"jobs": [{"job_state": "RUNNING"}]}, "no job_id"),
    ({"jobs": [{"job_id": 1}]}, "no state"),
    ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "n[1-"}]}, "malformed"),
    ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": 17}]}, "neither a hostlist"),
    ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "preempt_time": "later"}]}, "not a number"),
    ({"errors": ["slurm_load_jobs error"], "jobs": []}, "slurm_load_jobs error"),
])
def test_squeue_garbage(doc, message):
    with pytest.raises(SlurmDataError, match=message):
        parse_jobs(doc)


def test_empty_job_list_is_fine():
    assert parse_jobs({"jobs": [], "errors": []}) == []


# ----------------------------------------------------------------------------- sacct
def test_sacct_of_the_test_cluster():
    """``sacct -X -a --parsable2 --noheader`` of the 22.05 accounting test cluster (captured
    from tests/slurm/start-slurm.sh with SLURM_ACCOUNTING=1): a completed job, exit 75, a
    failed regular job, one cancelled while pending (no node), one killed by signal 9, one
    cancelled while running, one still running."""
    jobs = {j.job_id: j for j in parse_sacct((DATA / "sacct-22.05.txt").read_text())}
    assert sorted(jobs, key=int) == [str(i) for i in range(1, 9)]
    assert jobs["1"].states == {"COMPLETED"} and jobs["1"].exit_code == 0
    assert jobs["1"].name == "offcut-t000001.1-n1" and jobs["1"].nodes == ("n1",)
    assert jobs["1"].partition == "scavenger" and jobs["1"].submit_time == 1795753338
    assert jobs["2"].states == {"FAILED"} and jobs["2"].exit_code == 75
    assert jobs["4"].states == {"CANCELLED"} and jobs["4"].nodes == ()  # "CANCELLED by 0"
    assert jobs["5"].exit_code == 0 and jobs["5"].signal == 9
    assert jobs["6"].states == {"CANCELLED"} and jobs["6"].nodes == ("n1",)
    assert jobs["7"].states == {"RUNNING"} and jobs["7"].partition == "batch"


def test_sacct_hostlists_are_expanded():
    (job,) = parse_sacct("12|offcut-t1.1-n3|scavenger|TIMEOUT|0:15|n[3-4]|Unknown\n\n")
    assert job.nodes == ("n3", "n4") and job.submit_time == 0.0 and job.signal == 15


@pytest.mark.parametrize("text,message", [
    ("1|name|scavenger|COMPLETED|0:0|n1\n", "line 1: 6 columns"),
    ("1|a|p|COMPLETED|0:0|n1|1\n2|a|p|COMPLETED|0:0|n1|1|1500|extra\n", "line 2: 9 columns"),
    ("1|a|p|COMPLETED|0:0|n1|1|uid\n", "UID 'uid'"),
    (" |a|p|COMPLETED|0:0|n1|1\n", "no job id"),
    ("1|a|p|COMPLETED|x:0|n1|1\n", "exit code 'x:0'"),
    ("1|a|p|COMPLETED|0:0|n1|2026-11-27T04:22:18\n", "SLURM_TIME_FORMAT"),
    ("1|a|p|COMPLETED|0:0|n[1-|1\n", "node list"),
])
def test_sacct_garbage(text, message):
    with pytest.raises(SlurmDataError, match=message):
        parse_sacct(text)
