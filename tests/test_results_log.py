"""The benchmarks' results files (benchmarks/results_log.py; benchmarks/README.md, "Where
results go"): a run writes its figure lines, not its progress, under the machine, the commit
and its command, to a new ``NAME-DATE-TIME.txt``; ``--no-results`` writes nothing."""

from __future__ import annotations

import argparse
import datetime
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def results(monkeypatch, tmp_path):
    """benchmarks/results_log.py as the benchmarks import it, writing under ``tmp_path``."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import results_log

    monkeypatch.setattr(results_log, "RESULTS", tmp_path / "results")
    return results_log


def test_write_keeps_the_figures_under_machine_commit_and_command(results, capsys):
    log = results.ResultsLog("bench", argv=["--size", "3", "a b"])
    log.say("p99 4.2 ms")
    log.keep("table row   \n  second row  \n")
    path = log.write()
    assert path.parent == results.RESULTS
    assert re.fullmatch(r"bench-\d{4}-\d\d-\d\d-\d{6}\.txt", path.name)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# 20") and lines[1].startswith("# machine: ")
    assert "CPUs" in lines[1] and "Python" in lines[1]
    assert lines[2].startswith("# commit: ")
    assert lines[3] == "$ python benchmarks/bench.py --size 3 'a b'"
    assert lines[4:] == ["p99 4.2 ms", "table row", "  second row"]
    assert capsys.readouterr().out == "p99 4.2 ms\n"  # keep() prints nothing


def test_a_second_run_never_overwrites_a_file(results, monkeypatch):
    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(results, "dt", SimpleNamespace(datetime=Frozen,
                                                       timezone=datetime.timezone))
    first = results.ResultsLog("bench", argv=[])
    first.say("one")
    path = first.write()
    assert path.name == "bench-2026-01-02-030405.txt"
    with pytest.raises(FileExistsError):
        results.ResultsLog("bench", argv=[]).write()
    assert path.read_text().splitlines()[-1] == "one"


def test_no_results_prints_and_writes_nothing(results, capsys):
    ap = argparse.ArgumentParser()
    results.add_option(ap)
    args = ap.parse_args(["--no-results"])
    log = results.ResultsLog.from_args("bench", args, ["--no-results"])
    log.say("figure")
    assert log.finish() is None
    assert not results.RESULTS.exists()
    out = capsys.readouterr().out
    assert out.startswith("figure\n") and "--no-results" in out
    # without the option the same log writes, and says where
    log = results.ResultsLog.from_args("bench", ap.parse_args([]), [])
    log.say("figure")
    path = log.finish()
    assert path.exists() and f"figures written to {path}" in capsys.readouterr().out


def test_a_benchmark_writes_its_figure_lines_not_its_progress(results, capsys):
    import decision_time

    argv = ["--repeat", "1", "--solvers", "dp", "--no-anchor", "--replay-nodes", "0",
            "--data-dir", str(results.RESULTS.parent / "no-data")]
    decision_time.main(argv)
    (path,) = results.RESULTS.iterdir()
    text = path.read_text().splitlines()
    assert text[3] == "$ python benchmarks/decision_time.py " + " ".join(argv)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"figures written to {path}"
    assert text[4:] == printed[:-1]  # every figure line, in order, and nothing else
    assert text[4].startswith("task curves: synthetic Amdahl")
    assert [ln.split()[:2] for ln in text[6:]] == [["10x128", "dp"], ["50x512", "dp"],
                                                   ["100x4734", "dp"]]

    decision_time.main(argv + ["--no-results"])
    assert list(results.RESULTS.iterdir()) == [path]
