"""``NodeEvents.StreamNodes``: node events on one stream (the replay's path), applied and
answered as ``ReportNodes`` applies and answers them, in the order sent, with the sender
sending ahead; a refused event ends the stream and changes nothing; the stream is bounded
like every other (size per message, open streams)."""

from __future__ import annotations

import time

import pytest

from offcut.errors import InvalidArgument, ResourceExhausted

from daemon_helpers import T0, decision_key, make_spec, status_key

#: these tests drive the event clock with explicit times (a replay daemon)
pytestmark = pytest.mark.replay_clock

NODES = [f"n{i:03d}" for i in range(40)]


def _events() -> list[tuple[float, int, list[str], list[str]]]:
    """(time, seq, idle, preempted): nodes join in fours, every third event takes two back."""
    out, idle, seq = [], [], 1
    for k in range(10):
        seq += 1
        join = NODES[4 * k:4 * k + 4]
        idle += join
        out.append((T0 + 10 * seq, seq, join, []))
        if k % 3 == 2:
            seq += 1
            taken, idle = idle[:2], idle[2:]
            out.append((T0 + 10 * seq, seq, [], taken))
    return out


def _start(daemons, name: str, **config):
    _, client = daemons.start(name, **config)
    client.submit(make_spec("a", max_nodes=8, ns=(0, 1, 2, 4, 8),
                            ps=(0.0, 10.0, 18.0, 30.0, 50.0)), submit_time=T0)
    client.submit(make_spec("b", max_nodes=8, ns=(0, 1, 2, 4, 8),
                            ps=(0.0, 12.0, 20.0, 28.0, 40.0), up=5.0), submit_time=T0)
    client.sync_nodes(T0 + 10, "replay", 1, [])
    return client


def test_a_stream_sent_ahead_is_answered_as_report_nodes_answers_each_event(daemons):
    unary, streamed = _start(daemons, "unary"), _start(daemons, "stream")
    events = _events()
    expected = [unary.report_nodes(t, "replay", seq, idle=i, preempted=p)
                for t, seq, i, p in events]
    stream = streamed.stream_nodes()
    for t, seq, i, p in events:  # all sent before the first answer is read
        stream.send(t, "replay", seq, idle=i, preempted=p)
    assert stream.pending == len(events)
    got = [stream.receive() for _ in events]
    stream.close()
    assert [d.revision for d in got] == sorted(d.revision for d in got)  # in the order sent
    assert [decision_key(d) for d in got] == [decision_key(d) for d in expected]
    assert any(d.placements for d in got)  # the events did re-allocate
    assert status_key(streamed) == status_key(unary)
    with pytest.raises(InvalidArgument, match="^receive: every event sent"):
        stream.receive()


def test_a_refused_event_ends_the_stream_and_changes_nothing(daemons):
    client = _start(daemons, "a")
    stream = client.stream_nodes()
    stream.send(T0 + 20, "replay", 2, idle=NODES[:4])
    stream.send(T0 + 30, "replay", 3, idle=["bad name!"])  # refused: not a node name
    stream.send(T0 + 40, "replay", 4, idle=NODES[4:8])  # after the refused one: never applied
    first = stream.receive()
    assert first.stats.idle_nodes == 4
    before = status_key(client)
    with pytest.raises(InvalidArgument, match=r"^idle: entry 0 .* not a valid node name"):
        stream.receive()
    stream.close()
    assert status_key(client) == before
    assert client.status().last_seq["replay"] == 2
    # the sender goes on where the daemon stopped, on a new stream: an applied event sent
    # again is answered from the journal (a repeat), the next one is applied
    again = client.stream_nodes()
    again.send(T0 + 20, "replay", 2, idle=NODES[:4])
    again.send(T0 + 40, "replay", 3, idle=NODES[4:8])
    repeat = again.receive()
    assert repeat.duplicate and decision_key(repeat) == decision_key(first)
    assert again.receive().stats.idle_nodes == 8
    again.close()
    assert client.status().idle_nodes == 8


def test_a_message_over_one_mib_ends_the_stream_with_resource_exhausted(daemons):
    client = _start(daemons, "a")
    stream = client.stream_nodes()
    stream.send(T0 + 20, "replay", 2, idle=NODES[:4])
    stream.send(T0 + 30, "replay", 3, idle=[f"m{i:07d}" for i in range(120_000)])  # ~1.1 MiB
    assert stream.receive().stats.idle_nodes == 4
    before = status_key(client)
    with pytest.raises(ResourceExhausted, match="^request: .* more than the 1 MiB StreamNodes"):
        stream.receive()
    stream.close()
    assert status_key(client) == before
    # the same event as ReportNodes (limit max_message_mb) is applied
    assert client.report_nodes(T0 + 30, "replay", 3,
                               idle=[f"m{i:07d}" for i in range(120_000)]).stats.idle_nodes \
        == 120_004


def test_streams_count_against_the_open_stream_limit(daemons):
    client = _start(daemons, "a", max_streams=1)
    first = client.stream_nodes()
    first.send(T0 + 20, "replay", 2, idle=NODES[:4])
    assert first.receive().stats.idle_nodes == 4
    second = client.stream_nodes()
    second.send(T0 + 30, "replay", 3, idle=NODES[4:8])
    with pytest.raises(ResourceExhausted, match="^StreamNodes: .*max_streams"):
        second.receive()
    second.close()
    assert client.status().last_seq["replay"] == 2
    first.close()  # its slot comes back (when the daemon has seen the stream end)
    deadline = time.monotonic() + 30
    while True:
        third = client.stream_nodes()
        third.send(T0 + 30, "replay", 3, idle=NODES[4:8])
        try:
            assert third.receive().stats.idle_nodes == 8
            break
        except ResourceExhausted:
            assert time.monotonic() < deadline, "the closed stream's slot never came back"
            time.sleep(0.05)
        finally:
            third.close()


def test_the_replay_sends_an_event_too_large_for_the_stream_as_report_nodes(tmp_path,
                                                                            monkeypatch):
    """The replay streams its node events 4 ahead; one whose message could pass the stream's
    limit goes as a ReportNodes call after the Decisions due, and the outputs are those of a
    replay that sends every event as ReportNodes."""
    import pandas as pd

    import offcut.replay.driver as driver
    from offcut.client import Client
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.synth import demo_data_dir

    data = demo_data_dir()
    calls = {"unary": 0}

    def counting(address: str) -> Client:
        client = Client(address)
        plain = client.report_nodes

        def report_nodes(*args, **kwargs):
            calls["unary"] += 1
            return plain(*args, **kwargs)

        client.report_nodes = report_nodes
        return client

    out = {}
    for name, send_ahead, limit in (("unary", 0, 1 << 20), ("mixed", 4, 100)):
        monkeypatch.setattr(driver, "STREAM_MESSAGE_BYTES", limit)
        calls["unary"] = 0
        summary = driver.run_replay(
            load_node_log(data, skip_rows=0), load_task_set(data), tmp_path / name,
            driver.ReplayOptions(solver="dp", max_events=300, progress=False,
                                 send_ahead=send_ahead), connect=counting)
        out[name] = summary, calls["unary"]
    (unary, n_unary), (mixed, n_mixed) = out["unary"], out["mixed"]
    assert n_unary == unary["events"] == 300
    assert 0 < n_mixed < 300  # some events were over the (lowered) limit, most were not
    steps = [pd.read_csv(tmp_path / n / "steps.csv").drop(columns=["solve_ms"]) for n in out]
    assert steps[0].equals(steps[1])
    assert ((tmp_path / "unary" / "placements.csv").read_bytes()
            == (tmp_path / "mixed" / "placements.csv").read_bytes())
