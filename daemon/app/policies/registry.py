"""Allocation policies by name: the built-ins, then third-party classes registered as entry
points of the group ``offcut.policies`` (``name = "module:Class"`` in the package's
``pyproject.toml``, ``[project.entry-points."offcut.policies"]``; docs/replay-and-policies.md,
"Write your own policy"). A built-in name cannot be taken over by an entry point."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from .base import AllocationPolicy, PolicyError
from .energy import EnergyPolicy, ZeusCostPolicy
from .fair_share import FairSharePolicy
from .throughput import ThroughputPolicy

#: the entry-point group of third-party policies
ENTRY_POINT_GROUP = "offcut.policies"

#: built-in policies by name (``offcut.daemon.config.OBJECTIVES`` lists the same names)
BUILTIN_POLICIES: dict[str, type[AllocationPolicy]] = {
    cls.name: cls for cls in (ThroughputPolicy, EnergyPolicy, ZeusCostPolicy, FairSharePolicy)}


def _plugins() -> dict[str, list[EntryPoint]]:
    """Entry points of :data:`ENTRY_POINT_GROUP` by name (several when two distributions
    register one name), built-in names left out."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in BUILTIN_POLICIES:
            found.setdefault(ep.name, []).append(ep)
    return found


def available_policies() -> list[str]:
    """The names the ``policy`` setting accepts: the built-ins, then the installed entry
    points (sorted)."""
    return [*BUILTIN_POLICIES, *sorted(_plugins())]


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "unknown package"
    return f"entry point {ep.name} = {ep.value} ({where})"


def policy_class(name: str) -> type[AllocationPolicy]:
    """The class of policy ``name``. Raises :class:`PolicyError` for an unknown name (the
    message lists the available ones), a name two packages register, a plugin that fails to
    import, or an entry point that is not an :class:`AllocationPolicy` subclass."""
    if name in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[name]
    plugins = _plugins()
    eps = plugins.get(name)
    if not eps:
        known = ", ".join([*BUILTIN_POLICIES, *sorted(plugins)])
        raise PolicyError(f"unknown allocation policy {name!r}; available: {known} (third-party "
                          f"policies are entry points of the group {ENTRY_POINT_GROUP!r})")
    if len(eps) > 1:
        raise PolicyError(f"allocation policy {name!r} is registered more than once: "
                          + "; ".join(_origin(ep) for ep in eps))
    ep = eps[0]
    try:
        cls = ep.load()
    except Exception as exc:  # noqa: BLE001 - any failure of third-party code is reported
        raise PolicyError(f"allocation policy {name!r} failed to import ({_origin(ep)}): "
                          f"{type(exc).__name__}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, AllocationPolicy)):
        raise PolicyError(f"allocation policy {name!r} ({_origin(ep)}) is {cls!r}, not a "
                          "subclass of offcut.daemon.app.policies.AllocationPolicy")
    return cls


def get_policy(name: str) -> AllocationPolicy:
    """A new instance of policy ``name`` (:func:`policy_class`); a constructor that fails
    (it takes no arguments) is a :class:`PolicyError` too."""
    cls = policy_class(name)
    try:
        return cls()
    except Exception as exc:  # noqa: BLE001
        raise PolicyError(f"allocation policy {name!r}: {cls.__qualname__}() failed: "
                          f"{type(exc).__name__}: {exc}") from exc
