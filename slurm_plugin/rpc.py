"""A small sender of node events to the daemon (``offcut.v1.NodeEvents``), for the hooks and
the watcher.

It uses the generated stubs directly rather than :class:`offcut.client.Client`, so that a hook
imports only grpc, the node-event modules and :mod:`offcut.channel` (the channel, TLS and
bearer token every client uses; docs/architecture.md, "Security"): the hook's run time is a job's
time in CONFIGURING. The token is never logged. grpc is imported on first use: a hook that has
nothing to send, or whose daemon socket does not exist (:func:`offcut.addresses.
unreachable_reason`), never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from offcut.errors import OffcutError
from offcut.retry import is_unavailable

if TYPE_CHECKING:  # pragma: no cover
    from offcut.retry import Backoff


class DaemonError(Exception):
    """A failed call: ``code`` is the gRPC status name (``UNAVAILABLE``, ``FAILED_PRECONDITION``,
    ``DEADLINE_EXCEEDED`` ...), ``details`` the daemon's message."""

    def __init__(self, code: str, details: str):
        self.code = code
        self.details = details
        super().__init__(f"{code}: {details}")


class Sent:
    """What the daemon answered (the parts the hooks log). A plain class: ``dataclasses``
    would add ~6 ms to every hook's start."""

    __slots__ = ("revision", "duplicate", "nodes_left", "nodes_joined", "tasks_preempted",
                 "idle_nodes", "ignored_nodes")

    def __init__(self, revision: int, duplicate: bool, nodes_left: int, nodes_joined: int,
                 tasks_preempted: int, idle_nodes: int, ignored_nodes: list[str]):
        self.revision, self.duplicate = revision, duplicate
        self.nodes_left, self.nodes_joined = nodes_left, nodes_joined
        self.tasks_preempted, self.idle_nodes = tasks_preempted, idle_nodes
        self.ignored_nodes = ignored_nodes

    def __str__(self) -> str:
        s = (f"revision {self.revision}: {self.nodes_left} nodes left the idle pool, "
             f"{self.nodes_joined} joined, {self.tasks_preempted} tasks preempted, "
             f"{self.idle_nodes} idle now")
        if self.ignored_nodes:
            s += f", ignored (not idle in the daemon): {','.join(self.ignored_nodes[:20])}"
        if self.duplicate:
            s += " (duplicate: answered before)"
        return s


def _sent(decision) -> Sent:
    st = decision.stats
    return Sent(revision=decision.revision, duplicate=decision.duplicate,
                nodes_left=st.nodes_left, nodes_joined=st.nodes_joined,
                tasks_preempted=st.tasks_preempted, idle_nodes=st.idle_nodes,
                ignored_nodes=list(decision.ignored_nodes))


class NodeEventSender:
    """Sends ``ReportNodes`` / ``SyncNodes`` to one daemon.

    Args:
        address: ``unix:///path.sock`` or ``HOST:PORT``.
        timeout_s: default deadline per call [s].
        token: bearer token sent as ``authorization`` metadata (None: none).
        tls_ca: PEM file of the CA to trust for a TCP address (None: ``$OFFCUT_TLS_CA``, else
            no TLS; :func:`offcut.channel.open_channel`).
        munge_socket: munged's socket for MUNGE credentials when no token is given (None:
            ``$OFFCUT_MUNGE_SOCKET``, else the default; :func:`offcut.channel.open_channel`).
        insecure_token: send ``token`` to a TCP address without TLS all the same (None:
            ``$OFFCUT_INSECURE_TOKEN``; without it such a token is refused:
            :func:`offcut.channel.insecure_token_refusal`).
        retry: repeat a call that failed with UNAVAILABLE (the daemon restarting) with this
            backoff, the researcher's client's (:class:`offcut.retry.Backoff`), within the
            call's deadline; safe because the daemon answers a repeated ``(source, seq)``
            from its journal. None: one attempt.
        log: where the retries are logged (a hook's own logger; None: ``offcut.retry``).

    Raises :class:`offcut.errors.InvalidArgument` when the CA file cannot be read, for a
    token with a TCP address without TLS (unless ``insecure_token``; nothing is sent) and for
    a socket folder others could write.
    """

    def __init__(self, address: str, timeout_s: float = 10.0, token: str | None = None,
                 tls_ca: str | None = None, munge_socket: str | None = None,
                 retry: "Backoff | None" = None, log=None, insecure_token: bool | None = None):
        import grpc
        from offcut.channel import open_channel
        from offcut.v1 import nodes_pb2, nodes_pb2_grpc

        self._grpc, self._pb = grpc, nodes_pb2
        from offcut.addresses import normalize_address

        self.address = address = normalize_address(address)
        self.timeout_s = timeout_s
        self.retry = retry
        self._log = log
        self._channel = open_channel(address, token=token, tls_ca=tls_ca,
                                     munge_socket=munge_socket, insecure_token=insecure_token,
                                     options=retry.channel_options() if retry else None)
        self._stub = nodes_pb2_grpc.NodeEventsStub(self._channel)

    def close(self) -> None:
        """Close the channel (calls in flight are cancelled)."""
        self._channel.close()

    def __enter__(self) -> "NodeEventSender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout_s: float | None):
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            if self.retry is None:
                return _sent(method(request, timeout=max(limit, 0.001)))
            return _sent(self.retry.run(
                lambda left: method(request, timeout=max(left, 0.001)),
                is_unavailable, type(request).__name__, deadline_s=limit, logger=self._log))
        except self._grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            details = err.details() if hasattr(err, "details") else str(err)
            raise DaemonError(code.name if code is not None else "UNKNOWN",
                              f"{details} (daemon {self.address})") from None
        except OffcutError as err:  # no credential could be made (munged down)
            raise DaemonError(err.status, str(err)) from None

    def _time(self, time_ns: int):
        from google.protobuf.timestamp_pb2 import Timestamp

        return Timestamp(seconds=time_ns // 1_000_000_000, nanos=time_ns % 1_000_000_000)

    def report(self, *, time_ns: int, source: str, seq: int, idle: Iterable[str] = (),
               preempted: Iterable[str] = (), timeout_s: float | None = None) -> Sent:
        """``ReportNodes``; raises :class:`DaemonError`."""
        req = self._pb.NodeEvent(time=self._time(time_ns), source=source, seq=seq,
                                 idle=list(idle), preempted=list(preempted))
        return self._call(self._stub.ReportNodes, req, timeout_s)

    def sync(self, *, time_ns: int, source: str, seq: int, idle: Iterable[str],
             kinds: Mapping[str, tuple[int, Iterable[str]]] | None = None,
             timeout_s: float | None = None) -> Sent:
        """``SyncNodes`` (the full idle set; ``kinds``: node -> (GPUs, features) of every
        node known, replacing the daemon's table; None: unchanged); raises
        :class:`DaemonError`."""
        req = self._pb.NodeSnapshot(time=self._time(time_ns), source=source, seq=seq,
                                    idle=list(idle),
                                    kinds=[self._pb.NodeKind(node=n, gpus=g, features=list(f))
                                           for n, (g, f) in (kinds or {}).items()])
        return self._call(self._stub.SyncNodes, req, timeout_s)
