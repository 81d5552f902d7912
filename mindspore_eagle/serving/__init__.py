"""Serving: continuous batching (``batch.BatchEngine``) and the OpenAI-compatible HTTP server (``server``)."""

from .batch import BatchEngine, Event, QueueFullError, Request, RequestStats, plan_growth, plan_rows

__all__ = ["BatchEngine", "Event", "QueueFullError", "Request", "RequestStats", "plan_growth", "plan_rows"]
