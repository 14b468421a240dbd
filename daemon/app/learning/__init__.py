"""Per-task online learning of throughput, power and rescale costs (issue "Learn scalability
online"; docs/architecture.md, "Tasks and the progress model"): :class:`TaskLearner`
(:mod:`.learner`) composes the report checks (:mod:`.checks`), the timeline of allocations and
reports (:mod:`.timeline`), the measurements per node count (:mod:`.throughput`), the rescale-cost
estimates (:mod:`.rescale`) and the fitted curve (:mod:`.scalability`)."""

from offcut.daemon.app.learning.learner import *  # noqa: F401,F403 (the package's names)
from offcut.daemon.app.learning.learner import __all__  # noqa: F401
