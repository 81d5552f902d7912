"""Evaluation: the evaluation sets, the sharded resumable runner, traces and reports."""
