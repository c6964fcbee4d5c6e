"""Where the release review goes: tracking URI resolution and a fail-fast MLflow session.

Measured with MLflow 3.17 (shared/field-notes.md): against a dead server the default
client retries for 247 s per call, and async logging silently dropped 9 of 60 points.
So every session here logs synchronously with short retries and timeouts, and any
MLflow failure becomes one TrackingError that carries the command replaying the upload.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qverify.errors import InfraError, QVerifyError
from qverify.workdir import Workdir

# Applied unless the user set them: a refused connection fails in about 3 s (one 2 s
# backoff; 2.7 s measured here), a black-holed one in about 3 x timeout.
SHORT_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
# Always applied: async logging loses points when the server goes away; run URLs printed to
# stdout would corrupt `--json` output.
FORCED = {"MLFLOW_ENABLE_ASYNC_LOGGING": "false", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


class TrackingError(InfraError):
    """MLflow could not take the upload. The verdict stands; `replay` re-runs the upload."""

    def __init__(self, message: str, replay: str):
        super().__init__(message, fix=f"the verdict stands; replay the upload with: {replay}")
        self.replay = replay


@dataclass(frozen=True)
class TrackingTarget:
    uri: str
    artifact_root: str | None  # None: a server chooses (mlflow-artifacts:/ with --artifacts-destination)
    explicit: bool  # given by --tracking-uri (so the replay command must repeat it)

    @property
    def remote(self) -> bool:
        return self.uri.startswith(("http://", "https://"))

    @property
    def display(self) -> str:
        return safe_uri(self.uri)


def safe_uri(uri: str) -> str:
    """The URI without user:password@ (it goes into messages and replay commands)."""
    return re.sub(r"(://)[^/@]+@", r"\1", uri)


def resolve(workdir: Path, tracking_uri: str | None = None) -> TrackingTarget:
    """--tracking-uri, else MLFLOW_TRACKING_URI, else sqlite in the workdir (the file: store is in maintenance mode)."""
    wd = Workdir.at(workdir)
    explicit = bool(tracking_uri)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{wd.mlflow_db}"
    if uri.startswith("file:") or ("://" not in uri and not uri.startswith("databricks")):
        from qverify.errors import BadInput

        raise BadInput(f"tracking URI {uri!r} is MLflow's file store, which is in maintenance mode",
                       fix=f"use sqlite:///{wd.mlflow_db} or an http(s):// MLflow server")
    remote = uri.startswith(("http://", "https://"))
    root = None if remote else wd.mlflow_artifacts.as_uri()
    return TrackingTarget(uri=uri, artifact_root=root, explicit=explicit)


def replay_command(gate_id: str, workdir: Path, target: TrackingTarget | None = None) -> str:
    parts = ["qverify"]
    if Path(workdir).resolve() != Path(".qverify").resolve():
        parts += ["--workdir", str(workdir)]
    parts += ["report", "--gate", gate_id]
    if target is not None and target.explicit:
        parts += ["--tracking-uri", target.display]
    return shlex.join(parts)


@contextmanager
def session(target: TrackingTarget) -> Iterator[object]:
    """An MlflowClient bound to `target`, with fail-fast HTTP settings; restores globals on exit.

    The fluent globals are set too, because `mlflow.create_external_model` and
    `mlflow.search_runs` read them.
    """
    import mlflow
    from mlflow import MlflowClient
    from mlflow.tracking._model_registry import utils as reg_utils
    from mlflow.tracking._tracking_service import utils as trk_utils

    keys = [*SHORT_HTTP, *FORCED, "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"]
    saved_env = {k: os.environ.get(k) for k in keys}
    saved = (trk_utils._tracking_uri, reg_utils._registry_uri)
    for k, v in SHORT_HTTP.items():
        os.environ.setdefault(k, v)
    os.environ.update(FORCED)
    try:
        with _first_use_lock(target):
            # MLflow creates (and migrates) a sqlite store on first touch: two processes touching a fresh one
            # at once failed with "duplicate column name: step". Open and touch both stores one process at a time.
            mlflow.set_tracking_uri(target.uri)
            mlflow.set_registry_uri(target.uri)
            client = MlflowClient(tracking_uri=target.uri, registry_uri=target.uri)
            client.search_experiments(max_results=1)
            client.search_registered_models(max_results=1)
        yield client
    finally:
        trk_utils._tracking_uri, reg_utils._registry_uri = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _first_use_lock(target: TrackingTarget) -> Iterator[None]:
    """An exclusive fcntl lock beside a sqlite store (<db>.lock) while it is opened; no-op for a server."""
    if not target.uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(target.uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # blocks: the other process's first use takes seconds
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextmanager
def guard(target: TrackingTarget, step: list[str], replay: str) -> Iterator[None]:
    """Turn any MLflow/network/database failure into a TrackingError naming the step it hit."""
    try:
        yield
    except QVerifyError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        first = re.sub(r"\s+", " ", first)[:240]
        where = step[-1] if step else "connecting"
        raise TrackingError(f"MLflow at {target.display} failed while {where}: {type(e).__name__}: {first}",
                            replay=replay) from e


def ensure_experiment(client: object, name: str, target: TrackingTarget) -> str:
    """The experiment for one model; on a server its artifacts go through mlflow-artifacts:/."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    loc = None
    if target.artifact_root:
        loc = f"{target.artifact_root}/{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}"
    # "custom_model_development" makes the MLflow UI open these runs in its model-training view
    tags = {"qverify": "release-review", "mlflow.experimentKind": "custom_model_development"}
    return client.create_experiment(name, artifact_location=loc, tags=tags)
