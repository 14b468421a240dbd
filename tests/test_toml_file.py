"""The one TOML file reader (:mod:`offcut.toml_file`) and the spec's one wire conversion
(:mod:`offcut.wire.specs`), without a daemon."""

from __future__ import annotations

import pytest

from offcut import toml_file
from offcut.errors import InvalidArgument
from offcut.taskspec import Limits, TaskSpec
from offcut.toml_file import TomlFileError, read_toml
from offcut.v1 import tasks_pb2
from offcut.wire.specs import spec_from_pb, spec_to_pb


def test_a_good_file_is_its_table(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('address = "unix:///x.sock"\n[slurm]\nqueue = "q"\n')
    assert read_toml(path, "config") == {"address": "unix:///x.sock", "slurm": {"queue": "q"}}


def test_each_problem_names_the_file_and_where(tmp_path, monkeypatch):
    missing = tmp_path / "none.toml"
    with pytest.raises(TomlFileError, match=f"cannot read config {missing}: No such file"):
        read_toml(missing, "config")
    path = tmp_path / "bad.toml"
    path.write_text('a = 1\nb = \n')
    with pytest.raises(TomlFileError) as err:
        read_toml(path, "tokens file")
    assert str(err.value).startswith(f"tokens file {path}: not valid TOML: ")
    assert "line 2" in str(err.value)
    path.write_bytes(b'a = 1\nb = 2\nc = "\xff"\n')  # not UTF-8: an error, not a traceback
    with pytest.raises(TomlFileError, match=r"not UTF-8 \(at line 3\)"):
        read_toml(path, "config")
    monkeypatch.setattr(toml_file, "MAX_TOML_BYTES", 8)
    path.write_text("a = 1\nb = 2\n")
    with pytest.raises(TomlFileError, match="larger than 8 bytes"):
        read_toml(path, "config")


def test_the_check_sees_the_opened_file_and_may_refuse_it(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("a = 1\n")
    seen = []

    def check(st):
        seen.append(st.st_size)
        return "writable by others"

    with pytest.raises(TomlFileError, match=f"^config {path}: refused: writable by others$"):
        read_toml(path, "config", check=check)
    assert seen == [6]
    assert read_toml(path, "config", check=lambda st: None) == {"a": 1}


def test_a_spec_goes_to_the_wire_and_back_unchanged():
    spec = TaskSpec.create(name="t", min_nodes=1, max_nodes=2, node_counts=[0, 1, 2],
                           throughputs=[0.0, 5.0, 9.0], objective_values=[0.0, 1.0, 1.8],
                           rescale_up_s=3.0, rescale_down_s=4.0, total_work_samples=1e6,
                           command=["python", "t.py"], reports_progress=True,
                           power_w=[0.0, 100.0, 200.0], zeus_job_id="z", gpus_per_node=2,
                           constraint=["ib", "a100"], procs_per_node=1)
    msg = spec_to_pb(spec)
    assert list(msg.constraint) == ["a100", "ib"] and msg.gpus_per_node == 2
    assert spec_from_pb(msg) == spec


def test_a_bad_message_names_the_spec_field_and_the_limits_apply():
    msg = tasks_pb2.TaskSpec(name="t", min_nodes=1, max_nodes=9, total_work_samples=1.0,
                             gpus_per_node=65)
    with pytest.raises(InvalidArgument) as err:
        spec_from_pb(msg)
    assert err.value.field == "spec.gpus_per_node"
    msg.gpus_per_node = 0
    assert spec_from_pb(msg).learned
    with pytest.raises(InvalidArgument) as err:
        spec_from_pb(msg, Limits(max_task_nodes=8))
    assert err.value.field == "spec.max_nodes" and "max_task_nodes (8)" in str(err.value)
