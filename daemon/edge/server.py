"""Building and running the gRPC server (health checking and reflection included).

The server is ``grpc.aio``'s, on the process's event-loop thread
(:mod:`offcut.daemon.edge.event_loop`); :class:`OffcutServer` keeps a synchronous API over it. Unary
handlers run on the worker threads of :mod:`offcut.daemon.edge.workers` (node events on threads of
their own), server streams wait on the loop holding no thread (docs/architecture.md,
"Threads"; docs/security.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from offcut import munge
from offcut.addresses import make_private_parents
from offcut.daemon.edge.auth import (AuthInterceptor, Authenticator, RefusalDelay, TokensFileError,
                                check_private, load_tokens)
from offcut.daemon.config import RPC_WORKERS, DaemonConfig, split_host_port
from offcut.daemon.app.engine import Engine
from offcut.daemon.edge.event_loop import shared_loop
from offcut.daemon.edge.event_times import EventTimes
from offcut.daemon.edge.health import BoundedHealthServicer, HealthStatus
from offcut.daemon.edge.metrics import DaemonMetrics, MetricsEndpoint
from offcut.daemon.app.migrations import UPGRADES
from offcut.daemon.edge.munge_auth import MungeIdentity
from offcut.daemon.edge.node_side import NodeSideServer
from offcut.daemon.edge.request_guard import (NODE_EVENT_METHODS, SMALL_REQUEST_BYTES,
                                         RequestGuardInterceptor, request_limits,
                                         transport_limit)
from offcut.daemon.edge.service import NodeEventsService, StatusService, TasksService
from offcut.daemon.app.solvers.allocator import Allocator
from offcut.daemon.app.state_lock import StateLock, check_state_dir
from offcut.daemon.app.storage_errors import StateFull, StateReadOnly
from offcut.daemon.app.store import Store
from offcut.daemon.app.state_file import StoreError
from offcut.daemon.edge.streams import StreamSlots
from offcut.daemon.edge.workers import NODE_EVENT_WORKERS, ReservedLaneInterceptor, RpcWorkers
from offcut.daemon.zeus.registry import ZeusRegistry
from offcut.daemon.zeus.storage import ZeusStorage
from offcut.daemon.zeus.service import BatchSizeOptimizerService, PowerLimitOptimizerService
from offcut.unix_socket import SocketPathClaim
from offcut.v1 import (nodes_pb2, nodes_pb2_grpc, status_pb2, status_pb2_grpc, tasks_pb2,
                       tasks_pb2_grpc, zeus_pb2, zeus_pb2_grpc)

log = logging.getLogger("offcut.daemon")

SERVICE_NAMES = (
    nodes_pb2.DESCRIPTOR.services_by_name["NodeEvents"].full_name,
    tasks_pb2.DESCRIPTOR.services_by_name["Tasks"].full_name,
    status_pb2.DESCRIPTOR.services_by_name["Status"].full_name,
    zeus_pb2.DESCRIPTOR.services_by_name["BatchSizeOptimizer"].full_name,
    zeus_pb2.DESCRIPTOR.services_by_name["PowerLimitOptimizer"].full_name,
)


#: health-service name of the configured allocation backend: NOT_SERVING while its circuit
#: breaker is tripped (the daemon answers with dp meanwhile; the overall "" stays SERVING)
SOLVER_HEALTH = "offcut.solver"

#: health-service name of the state file: NOT_SERVING (and the overall "" with it) while
#: writes fail for read-only or full storage; SERVING again after the next write that succeeds
STATE_HEALTH = "offcut.state"


def _claim_unix_socket(address: str) -> SocketPathClaim:
    """The socket path of ``address`` claimed for this daemon (:mod:`offcut.unix_socket`):
    its missing folders made 0700, ``<path>.lock`` held, a stale socket of a previous run to be
    replaced by :meth:`SocketPathClaim.publish`. Raises RuntimeError
    (:class:`~offcut.unix_socket.SocketPathError`) when the folder could be another user's
    (another process could then put its own socket in the daemon's place: docs/security.md),
    the path is taken by something else, or another server holds or answers on it."""
    path = Path(address[len("unix://"):] if address.startswith("unix://") else address[len("unix:"):])
    make_private_parents(str(path))
    return SocketPathClaim(str(path))


def open_state(config: DaemonConfig, lock: StateLock, *, init: bool = False) -> Store:
    """The engine's store on ``config.state`` after every start-up check (identity, format,
    ``quick_check``, journal rows acknowledged by the previous daemon still present), with
    ``lock``'s commit mark following each commit.

    Raises:
        StoreError: the check that failed (docs/operations.md, "Start-up checks and
            refusals").
    """
    store = Store(config.state, snapshot_every=config.snapshot_every,
                  durability=config.durability, upgrades=UPGRADES, init=init, quick_check=True)
    last = store.last_journal_id()
    if lock.previous_mark is not None and last < lock.previous_mark:
        store.close()
        raise StoreError(
            f"{config.state}: journal rows {last + 1}..{lock.previous_mark} were acknowledged "
            f"by the previous daemon but are gone (its -wal file was deleted or truncated); "
            f"restore a backup, or accept the loss by removing {lock.path} "
            f"(docs/operations.md)")
    store.checkpoint()
    lock.mark(last)
    store.on_commit = lock.mark
    return store


def _munge_identity(config: DaemonConfig) -> MungeIdentity | None:
    """The MUNGE identity of ``config.munge`` (None when off), checked once against munged:
    a credential made and decoded at start, so that a missing libmunge, a munged that is
    down or on another socket refuses the start instead of every later call.

    Raises:
        RuntimeError: naming ``munge``/``munge_socket`` and the reason.
    """
    if not config.munge:
        return None
    try:
        identity = MungeIdentity(config.munge_socket, config.slurm_user, config.admin_users,
                                 config.admin_groups)
    except munge.MungeUnavailable as exc:
        raise RuntimeError(f"munge: {exc}") from None
    try:
        munge.decode(munge.encode(b"offcut-start", socket=identity.socket),
                     socket=identity.socket)
    except munge.MungeError as exc:
        identity.close()
        raise RuntimeError(f"munge_socket: munged at {identity.socket} does not answer: {exc}"
                           ) from None
    return identity


def _reachable_by_others(path: Path) -> bool:
    """Whether every folder above ``path`` lets other users through (o+x)."""
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in path.resolve().parents)


def _tls_credentials(config: DaemonConfig) -> grpc.ServerCredentials | None:
    """TLS server credentials from ``tls_cert``/``tls_key`` (None without them).

    Raises:
        RuntimeError: unreadable files, or a key file readable by others.
    """
    if config.tls_cert is None:
        return None
    try:
        check_private(Path(config.tls_key))
    except TokensFileError as exc:
        raise RuntimeError(f"tls_key: {exc}") from None
    try:
        cert = Path(config.tls_cert).read_bytes()
        key = Path(config.tls_key).read_bytes()
    except OSError as exc:
        raise RuntimeError(f"cannot read {exc.filename}: {exc.strerror}") from None
    if b"-----BEGIN" not in cert or b"-----BEGIN" not in key:
        raise RuntimeError("tls_cert and tls_key must be PEM files")
    return grpc.ssl_server_credentials([(key, cert)])


class OffcutServer:
    """The daemon: engine + gRPC server on ``config.listen`` (+ Prometheus metrics on
    ``config.metrics_listen`` when set, from :meth:`start`).

    Args:
        config: the daemon's settings.
        init: take an existing empty (0-byte or table-less SQLite) ``state`` file for a new
            state (``offcutd --init``); without it such a file is refused.

    Raises:
        offcut.daemon.app.state_file.StoreError: unusable state file (docs/operations.md lists why).
        offcut.daemon.app.state_lock.StateOwnershipError: the state is another live daemon's, or
            its folder is writable by others.
        RuntimeError: the address cannot be bound.
    """

    def __init__(self, config: DaemonConfig, init: bool = False):
        self.config = config
        # tokens and TLS files first: a bad one refuses the start before anything is opened
        try:
            tokens = load_tokens(config.tokens_file) if config.tokens_file else None
        except TokensFileError as exc:
            raise RuntimeError(f"tokens_file: {exc}") from None
        self.auth = Authenticator(tokens, _munge_identity(config))
        credentials = _tls_credentials(config)
        # then the state: a second daemon or a damaged file refuses the start at once
        make_private_parents(str(config.state))
        check_state_dir(config.state)
        #: the exclusive lock on the state (held until :meth:`stop`)
        self.state_lock = StateLock(config.state)
        # a failure before the registry is up releases what was taken (lock, files, solver)
        with contextlib.ExitStack() as undo:
            undo.callback(self.state_lock.release)
            store = open_state(config, self.state_lock, init=init)
            undo.callback(store.close)
            self._open_engine(config, store, undo)
            undo.pop_all()
        store.on_storage = self.zeus_store.on_storage = self._storage_changed
        #: why the state cannot be written now (None while it can)
        self.storage_problem: str | None = None
        self.metrics = DaemonMetrics(self.engine, self.zeus)
        self.metrics_endpoint: MetricsEndpoint | None = None
        #: TCP port of the /metrics endpoint once started (None without ``metrics_listen``)
        self.metrics_port: int | None = None
        #: request size limit [bytes] per method with one of its own (others: 1 MiB)
        self.request_limits = request_limits(config)
        self.streams = StreamSlots(config.max_streams, config.max_streams_per_caller)
        self.workers = RpcWorkers(RPC_WORKERS, NODE_EVENT_WORKERS)
        self._loop = shared_loop()
        self._stopped = False
        #: the unix socket's path (None for TCP) and this daemon's claim on it: bound under a
        #: fresh name, renamed over the path with its mode, unlinked at :meth:`stop` only while
        #: still this daemon's (:mod:`offcut.unix_socket`)
        self.socket_path: Path | None = None
        self._socket_claim: SocketPathClaim | None = None
        #: the node side's own server on ``config.node_listen`` (None without it)
        self.node_side: NodeSideServer | None = None
        try:
            self._loop.run(self._build(credentials))
            if self._socket_claim is not None:
                self._socket_claim.publish(self.socket_mode)
            if config.node_listen is not None:
                self.node_side = self._build_node_side(config.node_listen)
        except (RuntimeError, OSError) as exc:
            self.engine.close()
            self.zeus_store.close()
            self.workers.shutdown(wait=False)
            if self._socket_claim is not None:  # (removes the bound name, drops the lock)
                self._socket_claim.release()
            self.state_lock.release()
            if str(exc).startswith("cannot listen on node_listen"):
                raise
            raise RuntimeError(f"cannot listen on {config.listen}: {exc}") from exc

    @property
    def socket_mode(self) -> int:
        """The unix socket's mode: 0600 (only the service user may connect) unless callers
        are identified by MUNGE, then 0666 (every call proves its user; docs/security.md)."""
        return 0o666 if self.auth.munge is not None else 0o600

    async def _build(self, credentials: grpc.ServerCredentials | None) -> None:
        """The gRPC server with its services, bound to ``config.listen`` (on the event loop,
        which ``grpc.aio`` requires). Raises RuntimeError when the address cannot be bound."""
        config = self.config
        self.server = grpc.aio.server(
            migration_thread_pool=self.workers,  # runs the plain (unary) handlers
            # metrics outermost, so that refused calls are counted with their code; the guard
            # (sizes, undecodable requests) and the node events' reserved threads last
            interceptors=[self.metrics.interceptor,
                          AuthInterceptor(self.auth, RefusalDelay(config.refusal_delay_s)),
                          RequestGuardInterceptor(self.request_limits),
                          ReservedLaneInterceptor(NODE_EVENT_METHODS)],
            options=[*self._server_options(),
                     # calls the loop has not taken yet queue per method; past this many,
                     # gRPC sheds them at random (1,000 by default): let a burst of stream
                     # openings as large as max_streams (clients reconnecting) wait instead
                     ("grpc.server.max_pending_requests", max(1000, config.max_streams)),
                     ("grpc.server.max_pending_requests_hard_limit",
                      2 * max(1000, config.max_streams))])
        self._times = times = EventTimes(config.clock, auth_enabled=self.auth.enabled)
        nodes_pb2_grpc.add_NodeEventsServicer_to_server(
            NodeEventsService(self.engine, self.auth, times, self.streams,
                              self.workers.reserved), self.server)
        self.tasks_service = TasksService(self.engine, self.auth, self.streams, times, self.zeus)
        tasks_pb2_grpc.add_TasksServicer_to_server(self.tasks_service, self.server)
        status_pb2_grpc.add_StatusServicer_to_server(StatusService(self.engine, self.auth, times),
                                                     self.server)
        zeus_pb2_grpc.add_BatchSizeOptimizerServicer_to_server(
            BatchSizeOptimizerService(self.zeus, self.auth), self.server)
        zeus_pb2_grpc.add_PowerLimitOptimizerServicer_to_server(
            PowerLimitOptimizerService(self.zeus, self.auth), self.server)
        health_servicer = BoundedHealthServicer(self.streams)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.server)
        #: set a service's health status from any thread (``set``, ``enter_graceful_shutdown``)
        self.health = HealthStatus(health_servicer, self._loop)
        reflection.enable_server_reflection(
            SERVICE_NAMES + (health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                             reflection.SERVICE_NAME), self.server)
        address = bind = config.listen
        if address.startswith("unix:"):
            self._socket_claim = _claim_unix_socket(address)
            self.socket_path = Path(self._socket_claim.path)
            address, bind = f"unix://{self.socket_path}", f"unix://{self._socket_claim.bind_path}"
        if credentials is not None:
            self.port = self.server.add_secure_port(bind, credentials)
        else:
            self.port = self.server.add_insecure_port(bind)
        self.address = address

    def _server_options(self) -> list[tuple[str, int]]:
        """The message size limits of both servers (``listen`` and the node side) [bytes]."""
        return [("grpc.max_receive_message_length", transport_limit(self.config)),
                ("grpc.max_send_message_length", self.config.max_message_mb * 1024 * 1024)]

    def _build_node_side(self, address: str) -> NodeSideServer:
        """The node side's server on ``address`` (:mod:`offcut.daemon.edge.node_side`): the same
        engine, tokens and event times, MUNGE decoding threads of its own. Raises
        RuntimeError when it cannot listen."""
        auth = Authenticator(self.auth.tokens, _munge_identity(self.config))
        service = NodeEventsService(self.engine, auth, self._times, self.streams,
                                    self.workers.reserved)
        try:
            return NodeSideServer(address, service, auth, [self.metrics.interceptor],
                                  RefusalDelay(self.config.refusal_delay_s),
                                  self.request_limits, self._server_options(), self.workers)
        except RuntimeError:
            if auth.munge is not None:
                auth.munge.close()
            raise

    def request_limit(self, method: str) -> int:
        """The request size limit [bytes] of the full method name ``method``."""
        return self.request_limits.get(method, SMALL_REQUEST_BYTES)

    def _solver_tripped(self, backend: str, tripped: bool, reason: str) -> None:
        """The allocator's circuit breaker of ``backend`` tripped or closed: say so in the log
        and in the health service (``offcut.solver``; the daemon itself keeps serving, exact
        ``dp`` answers meanwhile)."""
        if tripped:
            log.error("solver %s tripped (%s); dp answers until it is tried again", backend,
                      reason)
        else:
            log.warning("solver %s answers again", backend)
        status = (health_pb2.HealthCheckResponse.NOT_SERVING if tripped
                  else health_pb2.HealthCheckResponse.SERVING)
        if getattr(self, "health", None) is not None:
            self.health.set(SOLVER_HEALTH, status)

    def _storage_changed(self, reason: str | None) -> None:
        """A write to the state file failed for read-only or full storage (``reason``), or
        succeeded again (None): the overall health and ``offcut.state`` follow (the store
        has logged the reason)."""
        self.storage_problem = reason
        status = (health_pb2.HealthCheckResponse.NOT_SERVING if reason
                  else health_pb2.HealthCheckResponse.SERVING)
        if getattr(self, "health", None) is not None and not self._stopped:
            for name in ("", STATE_HEALTH):
                self.health.set(name, status)

    def _open_engine(self, config: DaemonConfig, store: Store,
                     undo: contextlib.ExitStack) -> None:
        """The solver, the engine on ``store`` and the Zeus registry on a second connection
        (each registered with ``undo`` for a failed start). Raises like the constructor."""
        from offcut.daemon.app.solvers.dp import compiled_kernel_missing, warm_up
        from offcut.daemon.app.solvers.gurobi import NOT_INSTALLED, gurobi_importable

        if config.solver == "gurobi" and not gurobi_importable():
            raise RuntimeError(f"solver = gurobi, but {NOT_INSTALLED}; choose solver = dp (exact, "
                               "the default) or cbc")

        log.info("dp kernel ready in %.1f s", warm_up())  # the exact fallback of every backend
        missing = compiled_kernel_missing()
        if missing:
            log.warning("%s: the dp solver runs its numpy version (same optimum, about 50x "
                        "slower at whole-machine scale); pip install numba", missing)
        allocator = Allocator(config.solver, time_limit_s=config.solver_time_limit_s,
                              isolate=config.isolate_solver, trip_after=config.solver_trip_after,
                              cooldown_s=config.solver_cooldown_s, on_trip=self._solver_tripped)
        undo.callback(allocator.close)
        limits = config.limits()  # one set, shared by the engine and the Zeus registry
        self.engine = Engine(store, allocator, tfwd_s=config.tfwd_s,
                             max_running_tasks=config.max_running_tasks,
                             record_instances=config.record_instances, limits=limits,
                             objective=config.objective_settings(),
                             max_failed_generations=config.max_failed_generations,
                             finished_task_retention_s=config.finished_task_retention_s,
                             final_grace_s=config.final_grace_s,
                             task_archive_retention_s=config.task_archive_retention_s,
                             journal_retention_s=config.journal_retention_s,
                             max_active_tasks_per_owner=config.max_active_tasks_per_owner,
                             max_retained_tasks_per_owner=config.max_retained_tasks_per_owner,
                             max_retained_task_bytes_per_owner=(
                                 config.max_retained_task_bytes_per_owner))
        # The Zeus optimizers keep their tables in the same file on their own connection:
        # their transactions must not interleave with the engine's on one connection (SQLite
        # serialises writers; docs/zeus.md, "Storage").
        self.zeus_store = ZeusStorage(config.state, durability=config.durability)
        undo.callback(self.zeus_store.close)
        self.zeus = ZeusRegistry(self.zeus_store, limits,
                                 trial_retention=config.zeus_trial_retention,
                                 request_retention_s=config.zeus_request_retention_s,
                                 trial_rows_retention=config.zeus_trial_rows_retention,
                                 observation_retention=config.zeus_observation_retention,
                                 max_jobs_per_owner=config.max_zeus_jobs_per_owner)

    def start(self) -> None:
        """Start serving (and the metrics endpoint when configured); marks every service
        SERVING in the health service.

        Raises:
            RuntimeError: ``metrics_listen`` cannot be bound; the server is stopped then (as
                :meth:`stop`: state file closed, socket removed).
        """
        if self.config.metrics_listen is not None:
            host, port = split_host_port(self.config.metrics_listen)
            try:
                self.metrics_endpoint = self.metrics.serve(host, port)
            except OSError as exc:
                self.stop(0)  # release the gRPC address and close the state file
                raise RuntimeError(f"cannot serve metrics on metrics_listen "
                                   f"{self.config.metrics_listen}: {exc.strerror or exc}") from exc
            self.metrics_port = self.metrics_endpoint.port
            log.info("Prometheus metrics on %s", self.metrics_endpoint.url)
        self._loop.run(self.server.start())
        if self.node_side is not None:
            self.node_side.start()
            log.info("node events also on %s (mode 0600)", self.node_side.address)
        if self.socket_path is not None:
            if self.auth.munge is not None and not _reachable_by_others(self.socket_path):
                log.warning("munge is on, but other users cannot reach %s (a folder above it "
                            "lacks o+x); chmod 755 its folder", self.socket_path)
        for name in SERVICE_NAMES + ("", SOLVER_HEALTH, STATE_HEALTH):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.config.insecure_local and not self.auth.enabled and self.socket_path is None:
            log.warning("INSECURE: %s is TCP without tokens_file (insecure_local): every local "
                        "user who can reach the port is admin", self.address)
        if (self.socket_path is None and self.auth.tokens is not None
                and self.config.tls_cert is None):
            log.warning("%s is TCP without TLS: clients send their tokens only with "
                        "insecure_token (--insecure-token, $OFFCUT_INSECURE_TOKEN=1), since any "
                        "local process that takes the port while offcutd is down would receive "
                        "them; set tls_cert/tls_key or listen on a unix socket "
                        "(docs/security.md)", self.address)
        log.info("offcutd serving on %s (solver %s, state %s, clock %s)", self.address,
                 self.config.solver, self.config.state, self.config.clock)

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting calls, end the open ``WatchPlacements`` streams (status OK), give
        in-flight calls up to ``grace_s`` [s] to finish (then cancel them), snapshot and close
        the state file, remove the unix socket (only while the path is still the socket this
        daemon bound: a successor's stays; :mod:`offcut.unix_socket`) and its lock. A second
        call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self.node_side is not None:
            self.node_side.stop(grace_s)
        self._loop.run(self._stop(grace_s))
        self.workers.shutdown(wait=False)
        if self.auth.munge is not None:
            self.auth.munge.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
            self.metrics_endpoint = None
        try:
            self.engine.close()  # (closes the file even when its final snapshot fails)
        except (StateReadOnly, StateFull) as exc:  # logged once by the store; no traceback
            log.error("stopped without the final snapshot (the journal holds every "
                      "acknowledged event): %s", exc)
        self.zeus_store.close()  # its committer thread, then its connections
        if self._socket_claim is not None:  # only while the path is still this daemon's socket
            self._socket_claim.release()
        self.state_lock.release()

    async def _stop(self, grace_s: float) -> None:
        """:meth:`stop`'s part on the event loop."""
        await self.health.servicer.enter_graceful_shutdown()
        self.tasks_service.end_watches()
        await self.server.stop(grace_s)

    def wait(self) -> None:
        """Block until the server terminates."""
        self._loop.run(self.server.wait_for_termination())
