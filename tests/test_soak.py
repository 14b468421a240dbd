"""The soak benchmark (benchmarks/soak.py) at test scale: a replay-clock daemon gets a
synthetic node log of the real burst sizes played as laps, the watcher's syncs, fresh tasks and
recurring Zeus jobs over several short "months"; the journal and the daemon's state stay within
their retention windows instead of growing with the months. The year-long run and its ratios
are the benchmark's (``python benchmarks/soak.py``)."""

from __future__ import annotations

import json

from daemon_helpers import load_benchmark


def test_state_stays_within_its_retention_over_months(tmp_path, capsys):
    soak = load_benchmark("soak")
    out = tmp_path / "soak.json"
    rc = soak.main(["--laps", "4", "--node-log", str(tmp_path / "absent.tar.gz"),
                    "--max-events", "600", "--month-days", "0.25", "--tasks-per-day", "96",
                    "--watch-interval-s", "300", "--snapshot-every", "100",
                    "--journal-retention-s", "3600", "--finished-task-retention-s", "3600",
                    "--zeus-jobs", "2", "--no-progress", "--json", str(out), "--max-ratio", "3",
                    "--no-results"])
    text = capsys.readouterr().out
    assert "SYNTHETIC node log" in text  # it says so when the real log is absent
    months = json.loads(out.read_text())["months"]
    complete = [m for m in months if m["complete"]]
    assert len(complete) >= 3, text
    # an hour of journal (plus what the kept snapshots need) however many days were played
    rows = [m["journal_rows"] for m in complete]
    assert max(rows) < 600, rows
    assert all(m["node_events"] > 0 and m["submissions"] > 0 for m in complete)
    assert rc in (0, 1) and ("PASS" in text or "FAIL" in text)
