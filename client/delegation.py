"""Attributes of a facade that one of its parts keeps (the training side's classes,
:class:`~offcut.client.elastic.ElasticRun` and :class:`~offcut.client.training.ZeusTraining`,
hand their state to collaborating objects but keep it readable and settable as before)."""

from __future__ import annotations


def delegated(part: str, name: str, doc: str) -> property:
    """A read-write property whose value is the attribute ``name`` of the object held in the
    attribute ``part`` of the instance (``self.<part>.<name>``), documented by ``doc``."""

    def get(self):
        return getattr(getattr(self, part), name)

    def set_(self, value) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, set_, doc=doc)
