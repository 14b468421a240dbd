"""How the ``offcut`` commands reach the daemon: one pydantic-settings model,
:class:`ClientSettings`, read from (first found wins, per setting)

1. the command's flag (``--address``, ``--token-file``, ... generated from the model's fields
   by :func:`connection_options`: name, help, type);
2. the environment, ``OFFCUT_`` + the setting's name in capitals (``OFFCUT_ADDRESS``,
   ``OFFCUT_TOKEN``, ``OFFCUT_TOKEN_FILE``, ``OFFCUT_TLS_CA``, ...; an empty variable is unset);
3. a TOML file: ``--config FILE``, else ``$XDG_CONFIG_HOME/offcut/client.toml``
   (``~/.config/offcut/client.toml``) when it exists; its keys are the settings' names;
4. the defaults.

The config file must be the user's own: a file, or a folder above it, that another user could
write (writable by group or others, or owned by neither the user nor root) is refused, since it
could point the client, and its token, at another process (:func:`config_file_problem`).
A token is sent only over a unix socket or TLS; ``insecure_token`` lets it travel over TCP
without TLS (:func:`offcut.channel.insecure_token_refusal`).

The token itself (``OFFCUT_TOKEN``) is read from the environment only, never from a flag
(other users see a command line) nor from the file (put it in a 0600 file named by
``token_file``); a token, when set, is used before a token file, as :mod:`offcut.channel`
always did. A bad value, an unknown or misplaced file key and an unreadable file are
:class:`SettingsError`: one line naming the flag, the variable or the file and its key.
docs/user-guide.md, "Client settings", lists the settings.
"""

from __future__ import annotations

import functools
import inspect
import os
import stat
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, get_args

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (BaseSettings, InitSettingsSource, PydanticBaseSettingsSource,
                               SettingsConfigDict)

from offcut.client.api import Client
from offcut.client.retry import RetryPolicy
from offcut.toml_file import TomlFileError, read_toml

ENV_PREFIX = "OFFCUT_"
#: the config file's values for the settings being built (:func:`load_client_settings`)
_FILE_VALUES: ContextVar[dict[str, Any]] = ContextVar("offcut_client_file_values", default={})
#: longest address / TLS server name / path accepted, characters
MAX_TEXT_LEN = 4096
#: largest call timeout and retry deadline, s (one day)
MAX_SECONDS = 86_400.0


def default_config_file() -> Path:
    """``$XDG_CONFIG_HOME/offcut/client.toml`` (``~/.config/offcut/client.toml`` without it)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "offcut" / "client.toml"


def _printable(value: Any) -> Any:
    """``value`` when it is None or printable text of at most :data:`MAX_TEXT_LEN` characters
    (no control characters, no line breaks); else ValueError."""
    if value is None:
        return value
    text = str(value)
    if not text or len(text) > MAX_TEXT_LEN or not text.isprintable():
        raise ValueError(f"must be printable text of 1 to {MAX_TEXT_LEN} characters")
    return value


class ClientSettings(BaseSettings):
    """The ``offcut`` commands' connection to the daemon (module docstring: where each value
    comes from). Every field but ``token`` is also a flag (``--`` + its name with dashes,
    ``flags`` in its ``json_schema_extra`` where it has a short one)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True,
                                      extra="forbid", validate_default=True)

    address: Optional[str] = Field(
        None, description="daemon address: unix:///path.sock, a socket path or HOST:PORT",
        json_schema_extra={"flags": ["--address", "-a"], "default_doc": "the local socket"})
    token: Optional[SecretStr] = Field(
        None, description="bearer token (environment only, never a flag nor a file key)",
        json_schema_extra={"flags": []})
    token_file: Optional[Path] = Field(
        None, description="file whose first line is the bearer token (mode 0600)")
    tls_ca: Optional[Path] = Field(
        None, description="PEM file of the CA to trust: TLS to a HOST:PORT daemon")
    tls_server_name: Optional[str] = Field(
        None, description="the name in the daemon's certificate, when not the address's host")
    munge_socket: Optional[Path] = Field(
        None, description="munged's socket: calls without a token carry a MUNGE credential",
        json_schema_extra={"default_doc": "/run/munge/munge.socket.2 when munged runs"})
    insecure_token: Optional[bool] = Field(
        None, description="send the token over TCP without TLS all the same (any local "
        "process that takes the port, e.g. while offcutd restarts, receives it)",
        json_schema_extra={"default_doc": "off: a token is sent only over a unix socket or TLS"})
    call_timeout_s: float = Field(
        30.0, gt=0.0, le=MAX_SECONDS, description=f"deadline of each call, s (0 < s <= "
        f"{MAX_SECONDS:.0f})")
    retry_deadline_s: float = Field(
        0.0, ge=0.0, le=MAX_SECONDS, description="retry the calls that are safe to repeat "
        "(offcut.client.retry) while the daemon restarts, for up to this long, s; 0 = fail "
        "at once")

    _check_text = field_validator("address", "tls_server_name", "token_file", "tls_ca",
                                  "munge_socket", mode="before")(_printable)

    @field_validator("token_file", "tls_ca", "munge_socket")
    @classmethod
    def _expand_home(cls, value: Path | None) -> Path | None:
        """``~`` and ``~user`` in a path (a file's value is not expanded by a shell)."""
        return None if value is None else value.expanduser()

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (the init arguments) > environment > the TOML file's values (read once by
        :func:`load_client_settings`)."""
        return init_settings, env_settings, InitSettingsSource(settings_cls, _FILE_VALUES.get())

    def client(self) -> Client:
        """A :class:`Client` with these settings (with a :class:`RetryPolicy` of deadline
        ``retry_deadline_s`` when it is > 0).

        Raises:
            InvalidArgument: an unusable token file or CA file; a token for a TCP address
            without TLS unless ``insecure_token`` (:class:`Client`).
        """
        retry = RetryPolicy(deadline_s=self.retry_deadline_s) if self.retry_deadline_s else None
        return Client(self.address, timeout_s=self.call_timeout_s,
                      token=self.token.get_secret_value() if self.token else None,
                      token_file=_text(self.token_file), tls_ca=_text(self.tls_ca),
                      tls_server_name=self.tls_server_name,
                      munge_socket=_text(self.munge_socket), retry=retry,
                      insecure_token=self.insecure_token)


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def flag_names(name: str) -> list[str]:
    """The flags of setting ``name``: its ``flags`` (``json_schema_extra``; an empty list:
    none, as for ``token``), else ``--`` + the name with dashes."""
    extra = ClientSettings.model_fields[name].json_schema_extra or {}
    flags = extra.get("flags")
    return [f"--{name.replace('_', '-')}"] if flags is None else list(flags)


#: the settings that are flags, in the model's order
FLAG_FIELDS = tuple(name for name in ClientSettings.model_fields if flag_names(name))


def env_name(name: str) -> str:
    """The environment variable of setting ``name`` (``OFFCUT_ADDRESS``)."""
    return ENV_PREFIX + name.upper()


def _default_doc(name: str) -> str:
    field = ClientSettings.model_fields[name]
    extra = field.json_schema_extra or {}
    if "default_doc" in extra:
        return str(extra["default_doc"])
    return "unset" if field.default is None else f"{field.default:g}"


def flag_help(name: str) -> str:
    """Help of setting ``name``'s flag: its description, variable, file key and default."""
    field = ClientSettings.model_fields[name]
    return (f"{field.description} [env {env_name(name)}; config key {name}; default: "
            f"{_default_doc(name)}]")


class SettingsError(ValueError):
    """A bad client setting: the message (one line) names the flag, the environment variable
    or the config file and key."""


def config_file_problem(path: Path, st: os.stat_result, uid: int | None = None) -> str | None:
    """Why the client config file ``path`` (``st``: its ``fstat``) cannot be trusted by user
    ``uid`` (default: this process's), else None: the file, or its folder (the folder of the
    file it links to, and the link's own folder), is writable by group or others or owned by
    neither ``uid`` nor root. Such a file could be rewritten by another user to send the
    client's token to their own listener (docs/security.md, "Round two: sockets and
    tokens")."""
    uid = os.getuid() if uid is None else uid
    checks: list[tuple[Path, os.stat_result]] = [(path, st)]
    folders = {path.absolute().parent, Path(os.path.realpath(path)).parent}
    for folder in sorted(folders):
        try:
            checks.append((folder, os.stat(folder)))
        except OSError as exc:
            return f"{folder}: {exc.strerror}"
    for what, info in checks:
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (uid, 0):
            return (f"{what} is owned by uid {info.st_uid}, neither yours (uid {uid}) nor root's; "
                    "another user could change it")
        if mode & 0o022:
            return (f"{what} is writable by group or others (mode {mode:04o}); another user "
                    f"could change it: chmod go-w {what}")
    return None


def load_client_settings(flags: Mapping[str, Any] | None = None,
                         config: str | Path | None = None) -> ClientSettings:
    """The settings from ``flags`` (setting name -> value; None = not given), the environment
    and the config file ``config`` (None: :func:`default_config_file` if it exists).

    Raises:
        SettingsError: ``config`` missing or unreadable, writable by another user
            (:func:`config_file_problem`), a file that is not TOML, a key the file may not hold
            (unknown, or ``token``), or a value out of its bounds, naming where it came from.
    """
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    path = Path(config) if config is not None else default_config_file()
    if config is not None or path.exists():
        try:
            values = read_toml(path, "config",
                               check=functools.partial(config_file_problem, path))
        except TomlFileError as exc:
            raise SettingsError(str(exc)) from None
        keys = set(values)
        if "token" in keys:
            raise SettingsError(f"config {path}: token: not read from a file; put the token "
                                "in a 0600 file and name it with token_file")
    else:
        path, values, keys = None, {}, set()
    reset = _FILE_VALUES.set(values)
    try:
        return ClientSettings(**given)
    except ValidationError as exc:
        raise SettingsError(_describe(exc.errors()[0], given, keys, path)) from None
    finally:
        _FILE_VALUES.reset(reset)


def _describe(error: dict, given: Mapping[str, Any], keys: set[str], path: Path | None) -> str:
    """One line for a validation error: where the value came from, by the precedence."""
    name = str(error["loc"][0]) if error["loc"] else ""
    if error["type"] == "extra_forbidden":  # (only the file can hold other keys)
        known = ", ".join(n for n in ClientSettings.model_fields if n != "token")
        return f"config {path}: unknown key {name!r} (known: {known})"
    message = error["msg"].removeprefix("Value error, ")
    if name != "token":
        message += f", got {str(error.get('input'))[:80]!r}"
    if name in given:
        return f"{flag_names(name)[0]}: {message}"
    if os.environ.get(env_name(name)):
        return f"${env_name(name)}: {message}"
    if name in keys:
        return f"config {path}: {name}: {message}"
    return f"{name}: {message}"  # (a default: cannot happen)


def connection_options(command: Callable) -> Callable:
    """Give a typer command the connection flags (one per :data:`FLAG_FIELDS` setting, from
    its field: name, help, type; all default to unset so that the environment and the file
    apply) and ``--config FILE``; the command is called with ``settings=`` the
    :class:`ClientSettings` they resolve to instead. A :class:`SettingsError` is one line on
    stderr, exit code 2."""
    import typer

    signature = inspect.signature(command)
    kept = [p for n, p in signature.parameters.items() if n != "settings"]
    added = {}
    for name in FLAG_FIELDS:
        field = ClientSettings.model_fields[name]
        kind = next((a for a in get_args(field.annotation) if a is not type(None)),
                    field.annotation)  # (Optional[X] -> X)
        added[name] = (Optional[kind], typer.Option(None, *flag_names(name),
                                                     help=flag_help(name), show_default=False))
    added["config"] = (Optional[Path], typer.Option(
        None, "--config", show_default=False,
        help="TOML file of these settings [default: $XDG_CONFIG_HOME/offcut/client.toml, "
             "else ~/.config/offcut/client.toml, if it exists]"))

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        config = kwargs.pop("config", None)
        flags = {name: kwargs.pop(name, None) for name in FLAG_FIELDS}
        try:
            settings = load_client_settings(flags, config)
        except SettingsError as exc:
            typer.echo(f"offcut: {exc}", err=True)
            raise typer.Exit(2)
        return command(*args, settings=settings, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=kept + [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                          annotation=annotation)
        for name, (annotation, option) in added.items()])
    wrapper.__annotations__ = {k: v for k, v in command.__annotations__.items()
                               if k != "settings"}
    wrapper.__annotations__.update({name: annotation for name, (annotation, _) in added.items()})
    return wrapper
