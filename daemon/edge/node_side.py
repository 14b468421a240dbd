"""The node side's own server: Slurm's node events on a socket, an event loop and MUNGE
decoding threads of their own (``node_listen``; docs/security.md, "Round two: junk
credentials").

With ``munge = true`` every local user may connect to ``listen`` (mode 0666) and send calls as
fast as they like, each with a credential munged must judge before it can be refused: every
such call passes gRPC's per-call work and the interceptors on ``listen``'s event loop, and its
credential ``listen``'s decoding threads. The refusal delay
(:class:`offcut.daemon.edge.auth.RefusalDelay`) bounds how many a sender gets judged per second;
this server keeps Slurm's node events out of that path altogether: a second unix socket, mode
0600 (only the daemon's own user, SlurmUser, which runs the hooks and the watcher, and root),
served by a second ``grpc.aio`` server on an event loop of its own
(:data:`offcut.daemon.edge.event_loop.NODE_LOOP`) with a
:class:`~offcut.daemon.edge.munge_auth.MungeIdentity` of its own (its own decoding threads). It
serves ``offcut.v1.NodeEvents`` only, applied by the same engine on the node events' reserved
worker threads (:mod:`offcut.daemon.edge.workers`); roles are checked as on ``listen``.

What it shields: anything that holds ``listen``'s loop or decoding threads (a flood, a slow
call, a bug) no longer holds a node event (``tests/test_junk_credentials.py`` blocks
``listen``'s loop outright). What it cannot: the node side shares the process's CPU, its
interpreter lock and its garbage collector with ``listen``, so a flood that saturates the CPU
still slows node events (measured with ``python benchmarks/munge_junk.py``: docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from offcut.addresses import make_private_parents
from offcut.daemon.edge.auth import AuthInterceptor, Authenticator, RefusalDelay
from offcut.daemon.edge.event_loop import NODE_LOOP, shared_loop
from offcut.daemon.edge.request_guard import NODE_EVENT_METHODS, RequestGuardInterceptor
from offcut.daemon.edge.workers import ReservedLaneInterceptor
from offcut.unix_socket import SocketPathClaim
from offcut.v1 import nodes_pb2_grpc

#: the node side's socket mode: the daemon's user (SlurmUser: hooks, watcher) and root only
NODE_SOCKET_MODE = 0o600


class NodeSideServer:
    """A ``grpc.aio`` server of ``offcut.v1.NodeEvents`` on ``address`` (a unix socket), on
    the node side's own event loop.

    Args:
        address: ``unix:///path.sock`` (``node_listen``); its missing folders are made 0700.
        service: the NodeEvents servicer (the daemon's engine behind it).
        auth: the node side's authenticator (a MUNGE identity of its own, when MUNGE is on).
        interceptors: the daemon's outermost interceptors to run first (metrics).
        delay: how refusals of calls that prove nobody are held (its own: its own bound).
        request_limits: request size limits [bytes] per full method name.
        options: the server's gRPC channel options (message sizes).
        executor: the worker threads of the unary handlers (the daemon's: node events take
            their reserved lane).

    Raises:
        RuntimeError: the socket path is taken or its folder could be another user's
            (:class:`offcut.unix_socket.SocketPathError`), or it cannot be bound.
    """

    def __init__(self, address: str, service: nodes_pb2_grpc.NodeEventsServicer,
                 auth: Authenticator, interceptors: list, delay: RefusalDelay,
                 request_limits: dict[str, int],
                 options: list[tuple[str, int]], executor):
        self.auth = auth
        self.loop = shared_loop(NODE_LOOP)
        path = Path(address[len("unix://"):])
        make_private_parents(str(path))
        try:
            self.claim = SocketPathClaim(str(path))
        except (RuntimeError, OSError) as exc:
            raise RuntimeError(f"cannot listen on node_listen {address}: {exc}") from None
        self.socket_path = Path(self.claim.path)
        #: the address clients give (``unix://`` + the socket's path)
        self.address = f"unix://{self.socket_path}"
        try:
            self.loop.run(self._build(service, [*interceptors, AuthInterceptor(auth, delay)],
                                      request_limits, options, executor))
            self.claim.publish(NODE_SOCKET_MODE)
        except (RuntimeError, OSError) as exc:
            self.claim.release()
            raise RuntimeError(f"cannot listen on node_listen {address}: {exc}") from None

    async def _build(self, service, interceptors, request_limits, options, executor) -> None:
        """The server bound to the claim's fresh name (on the node loop, which ``grpc.aio``
        requires)."""
        self.server = grpc.aio.server(
            migration_thread_pool=executor,
            interceptors=[*interceptors, RequestGuardInterceptor(request_limits),
                          ReservedLaneInterceptor(NODE_EVENT_METHODS)],
            options=options)
        nodes_pb2_grpc.add_NodeEventsServicer_to_server(service, self.server)
        self.server.add_insecure_port(f"unix://{self.claim.bind_path}")

    def start(self) -> None:
        """Start serving."""
        self.loop.run(self.server.start())

    def stop(self, grace_s: float) -> None:
        """Stop accepting calls, give in-flight ones ``grace_s`` [s], stop the decoding
        threads, and remove the socket (only while it is still this daemon's)."""
        self.loop.run(self.server.stop(grace_s))
        if self.auth.munge is not None:
            self.auth.munge.close()
        self.claim.release()
