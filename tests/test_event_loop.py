"""The gRPC event loop (offcut.daemon.edge.event_loop): uvloop where it can be imported, asyncio's
own loop where it cannot, and the same behaviour on both."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading

import pytest

from offcut.daemon.edge.event_loop import EventLoopThread, new_loop, shared_loop


def _block_uvloop(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError


def test_the_loop_is_uvloops_when_it_can_be_imported():
    uvloop = pytest.importorskip("uvloop", reason="uvloop is a dependency on Linux")
    loop, kind = new_loop()
    try:
        assert kind == "uvloop"
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    # the daemon's servers of this process (every server test) run on it
    assert shared_loop().kind == "uvloop"
    assert isinstance(shared_loop().loop, uvloop.Loop)


def test_without_uvloop_asyncios_loop_serves_and_the_log_says_so(monkeypatch, caplog):
    _block_uvloop(monkeypatch)
    with caplog.at_level(logging.INFO, logger="offcut.daemon"):
        loop, kind = new_loop()
    try:
        assert kind == "asyncio"
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()
    assert any("uvloop is not importable" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_an_event_loop_thread_runs_coroutines_executor_steps_and_callbacks(monkeypatch, uvloop):
    if uvloop:
        pytest.importorskip("uvloop", reason="uvloop is a dependency on Linux")
    else:
        _block_uvloop(monkeypatch)
    thread = EventLoopThread(name="offcut-test-loop")
    assert thread.kind == ("uvloop" if uvloop else "asyncio")

    async def work() -> tuple[str, str]:
        # a blocking step on the loop's default executor (offcut-stream threads), then back
        name = await asyncio.get_running_loop().run_in_executor(
            None, lambda: threading.current_thread().name)
        return name, threading.current_thread().name

    executor_thread, loop_thread = thread.run(work(), timeout_s=30)
    assert executor_thread.startswith("offcut-stream")
    assert loop_thread == "offcut-test-loop"
    called = threading.Event()
    thread.call_soon(called.set)  # from another thread
    assert called.wait(30)
    with pytest.raises(ValueError, match="raised on the loop"):
        async def fails() -> None:
            raise ValueError("raised on the loop")
        thread.run(fails(), timeout_s=30)
    thread.loop.call_soon_threadsafe(thread.loop.stop)
