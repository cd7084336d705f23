"""The engine core's own request counts, read from the scheduler stats of its steps."""

from __future__ import annotations

from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats


class SchedulerCounts(StatLoggerBase):  # type: ignore[misc]  # mypy skips vLLM: Any
    """The requests the engine core holds, from the scheduler stats that come with the
    outputs of each of its steps (the source of `vllm:num_requests_running` and
    `vllm:num_requests_waiting`, kept here because a second engine in the process takes
    those gauges over). The frontend's own request table is no substitute: an abort
    empties it before the engine core has heard of the abort."""

    def __init__(self) -> None:
        self.requests = 0

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self.requests = (
                scheduler_stats.num_running_reqs
                + scheduler_stats.num_waiting_reqs
                + scheduler_stats.num_skipped_waiting_reqs
            )

    def log_engine_initialized(self) -> None:
        pass
