"""Evaluation: the replicated runner, the crash-safe results store, and the gate statistics."""
