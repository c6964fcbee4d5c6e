"""Release review: local report (markdown + self-contained HTML + plots), MLflow upload, model registry.

Local first: gates/<id>/report/ is written before MLflow is contacted, and the upload
(`upload_gate`) is a separate, idempotent step keyed by the gate id. Heavy imports
(mlflow, matplotlib, pandas) stay inside the functions that need them.
"""

from qverify.reports.tracking import TrackingError

__all__ = ["TrackingError"]
