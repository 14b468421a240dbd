"""Hostile replay inputs (issue 37, finding 7): every replay input is bounded before it is
expanded (the one size guard, offcut.slurm_values.NodeBudget: hostlists counted before
python-hostlist builds them), and every malformed input ends in one line naming the file and
the line or record (exit 2 from the CLI), never a traceback or gigabytes of memory."""

from __future__ import annotations

import gzip
import time
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import offcut.replay.slurm_accounting as accounting
from offcut.client.cli import app
from test_cli_tasks import one_line_error
from offcut.replay.bftrainer_data import ReplayInputError, load_node_log
from offcut.replay.slurm_log import node_log_from_sacct
from offcut.slurm_values import NodeBudget, NodeListError, count_nodelist, expand_nodelist

T0 = pd.Timestamp("2026-11-27T04:00:00")
S0 = int(T0.value / 1e9)
END = T0 + pd.Timedelta(seconds=100)
runner = CliRunner()


def peak_mib(fn) -> tuple[float, object]:
    """(peak traced memory [MiB], the exception ``fn`` raised or its result)."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out = exc
        return tracemalloc.get_traced_memory()[1] / 2**20, out
    finally:
        tracemalloc.stop()


def one_line(result, *needles: str) -> str:
    """A refused replay: exit 2, one line on stderr, no traceback."""
    return one_line_error(result, 2, *needles)


# ------------------------------------------------------------------ the shared counter
@pytest.mark.parametrize("text,count", [
    ("n1", 1), ("n[1-4]", 4), ("n[01-16],x", 17), ("r[1-2]n[1-3]", 6), ("n[1-3,7]", 4),
    (",".join(["n[1-99999]"] * 30), 30 * 99999),
    ("n[1-" + "9" * 5000 + "]", 10**19),  # no int() of 5,000 digits (Python refuses those)
    ("n[" + "0" * 30 + "1-" + "0" * 30 + "2]", 2),  # leading zeros are not digits of size
])
def test_count_nodelist_counts_without_expanding(text, count):
    assert count_nodelist(text) == count


def test_the_budget_refuses_before_expanding():
    b = NodeBudget(limit=10)
    assert b.expand("n[1-6]") == [f"n{i}" for i in range(1, 7)] and b.used == 6
    with pytest.raises(NodeListError, match="more than 10 nodes in all"):
        b.charge("m[1-5]")
    assert b.used == 6  # nothing charged for the refused one
    with pytest.raises(NodeListError, match=r"names more than 10\^18 nodes"):
        expand_nodelist("n[1-" + "9" * 5000 + "]")


# ------------------------------------------------------------------ replay bftrainer
def tiny_log(folder: Path, idle: str) -> Path:
    """A safe-format log of 4 nodes whose first record names ``idle``, gzip'ed (a hostile
    hostlist of repeated pieces compresses to a few hundred bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nodes.csv").write_text("index,node\n" + "".join(f"{i},n{i + 1}\n"
                                                                 for i in range(4)))
    with gzip.open(folder / "events.csv.gz", "wt") as fh:
        fh.write(f'row,time,idle,busy\n0,2026-11-27T04:00:00,"{idle}",\n'
                 '1,2026-11-27T04:00:10,,n1\n')
    return folder


def test_a_tiny_events_file_naming_a_million_nodes_is_refused_before_expansion(tmp_path):
    # 10 pieces of n[1-99999]: the old reader built all 999,990 names (and the reported file
    # of 511 bytes 2.39 GB for 24 s) before noticing they are not the log's 4 nodes
    folder = tiny_log(tmp_path / "log", ",".join(["n[1-99999]"] * 10))
    assert (folder / "events.csv.gz").stat().st_size < 600
    started = time.perf_counter()
    peak, exc = peak_mib(lambda: load_node_log(folder, skip_rows=0))
    assert isinstance(exc, ReplayInputError), exc
    assert str(exc).startswith(f"{folder / 'events.csv.gz'}: line 2: bad hostlist in column "
                               "'idle'") and "names 999990 nodes (limit 4)" in str(exc), exc
    assert peak < 5 and time.perf_counter() - started < 5, (peak, exc)


@pytest.mark.parametrize("idle,needle", [
    (",".join(["n[1-99999]"] * 40), "names 3999960 nodes (limit 4)"),
    ("n[1-" + "9" * 5000 + "]", "names more than 10^18 nodes"),  # was a ValueError traceback
    ("n[1-", "malformed node list"),
    ("n1,n2,n99", "unknown node 'n99'"),
])
def test_replay_bftrainer_refuses_hostile_hostlists_in_one_line(tmp_path, idle, needle):
    folder = tiny_log(tmp_path / "log", idle)
    (tmp_path / "tasks.csv").write_text("x\n")
    r = runner.invoke(app, ["replay", "bftrainer", "--node-log", str(folder), "--tasks",
                            str(tmp_path / "tasks.csv"), "--skip-rows", "0", "--out",
                            str(tmp_path / "out"), "--no-progress"])
    one_line(r, str(folder / "events.csv.gz"), "line 2", needle)


def test_the_changes_pass_is_bounded_too(tmp_path, monkeypatch):
    # each pass over events.csv.gz has its own budget (MAX_INPUT_NODES, here 6)
    import offcut.slurm_values as values

    folder = tiny_log(tmp_path / "log", "n[1-2]")
    with gzip.open(folder / "events.csv.gz", "wt") as fh:
        fh.write("row,time,idle,busy\n0,2026-11-27T04:00:00,n[1-4],\n"
                 + "".join(f"{r},2026-11-27T04:00:{r:02d},,n[1-4]\n"
                           f"{r + 1},2026-11-27T04:00:{r + 1:02d},n[1-4],\n"
                           for r in range(1, 9, 2)))
    monkeypatch.setattr(values.NodeBudget.__init__, "__defaults__", (6,))
    log = load_node_log(folder, skip_rows=0)  # the initial state: 4 names
    with pytest.raises(ReplayInputError, match=r"line 4: .*more than 6 nodes in all"):
        list(log.events())


# ------------------------------------------------------------------ replay slurm
def sacct_rows(n: int, nodes: str) -> str:
    return "".join(f"{i}|j|batch|COMPLETED|{nodes}|{S0 + i}|{S0 + i + 1}\n"
                   for i in range(1, n + 1))


def test_a_small_accounting_naming_too_many_nodes_is_refused_before_any_expansion(monkeypatch):
    # 30 lines of 99,999 names: the old reader expanded (and held) 2.1 million names before
    # the total (here 2 million) refused the file; now every line is counted first
    monkeypatch.setattr(accounting, "MAX_EXPANDED_NODES", 2_000_000)
    text = sacct_rows(30, "n[1-99999]")
    assert len(text) < 2000
    peak, exc = peak_mib(lambda: node_log_from_sacct(text, ["n1"], T0, END, source="w.sacct"))
    assert isinstance(exc, ReplayInputError), exc
    assert str(exc).startswith("w.sacct line 21: the hostlists of this input name more than "
                               "2,000,000 nodes in all"), exc
    assert peak < 5, peak


def test_a_window_keeps_only_the_replayed_nodes_names():
    # under the guard, the names of other nodes are expanded one record at a time and
    # dropped: 5 x 99,999 names cost one record's expansion, not all of them
    text = sacct_rows(5, "n[1-99999]")
    peak, log = peak_mib(lambda: node_log_from_sacct(text, ["n1", "n7"], T0, END))
    assert not isinstance(log, Exception), log
    assert log.initial_idle == ["n1", "n7"] and log.num_events == 2  # busy 1 s .. 6 s
    assert peak < 20, peak  # the old reader held all 499,995 names (~35 MiB)
    held = accounting.busy_intervals(text, end_s=S0 + 100, keep={"n7"})
    assert [names for _, _, names in held] == [["n7"]] * 5


def deep(depth: int) -> str:
    return '{"jobs": [{"job_id": 1, "x": ' + "[" * depth + "]" * depth + "}]}"


def big_number(digits: int) -> str:
    return ('{"jobs": [{"job_id": 1, "partition": "b", "nodes": "n1", "time": {"start": 1, '
            '"end": 2}}, {"job_id": 2, "partition": "b", "nodes": "n1", "time": {"start": '
            + "9" * digits + ', "end": 2}}]}')


@pytest.mark.parametrize("text,needle", [
    # was a RecursionError traceback
    (deep(100_000), "w.json: record 0, line 1 column 91: JSON nested deeper than 64 levels"),
    # was a ValueError traceback (Python refuses int() of more than 4,300 digits)
    (big_number(5000), "w.json: record 1, line 1 column 156: a number of 5000 characters"),
    # parsed, but past the float range: was an OverflowError traceback
    (big_number(400), "w.json: record 1, line 1 column 156: a number of 400 characters"),
    ('{"jobs": [{"job_id": 1, "partition": "b", "nodes": "n1", "time": {"start": 1e300, '
     '"end": 2}}]}', "w.json record 0 (job 1): time/start 1e+300 is not a time"),
    # broken and deep: the truncation finder is bounded too
    ('{"jobs": [{"job_id": 3, "x": ' + "[" * 60 + "]" * 60 + ", ",
     "w.json: not readable JSON at line 1"),
    ("1|j|batch|COMPLETED|n1|1e400|5\n", "w.json line 1: start '1e400' is not epoch seconds"),
    ("1|j|batch|COMPLETED|n1|nan|5\n", "w.json line 1: start 'nan' is not epoch seconds"),
])
def test_malformed_accounting_is_one_line_naming_the_record(text, needle):
    with pytest.raises(ReplayInputError) as info:
        node_log_from_sacct(text, ["n1"], T0, END, source="w.json")
    assert str(info.value).startswith(needle) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("kind", ["deep", "number", "hostlists"])
def test_replay_slurm_cli_refuses_hostile_accounting_in_one_line(tmp_path, kind):
    sacct = tmp_path / "w.sacct"
    sacct.write_text({"deep": deep(100_000), "number": big_number(5000),
                      # 5.8 KB naming 45 x 999,990 names: was 1.65 GB before the limit
                      "hostlists": sacct_rows(45, ",".join(f"{c}[1-99999]"
                                                           for c in "abcdefghij"))}[kind])
    started = time.perf_counter()
    r = runner.invoke(app, ["replay", "slurm", "--sacct", str(sacct), "--nodes", "n[1-4]",
                            "--start", str(T0), "--end", str(END), "--tasks",
                            str(tmp_path / "none.csv"), "--out", str(tmp_path / "out")])
    one_line(r, str(sacct), {"deep": "record 0", "number": "record 1",
                             "hostlists": "line 21: the hostlists of this input name more "
                                          "than 20,000,000 nodes in all"}[kind])
    assert time.perf_counter() - started < 10
