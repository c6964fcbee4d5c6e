"""The workdir layout (README, "Workdir"): builds/, runs/, gates/, logs/, mlflow.db."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workdir:
    root: Path

    @classmethod
    def at(cls, path: str | Path) -> "Workdir":
        root = Path(path).expanduser().resolve()
        return cls(root)

    def ensure(self) -> "Workdir":
        for p in (self.builds, self.runs, self.gates, self.logs):
            p.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def builds(self) -> Path:
        return self.root / "builds"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def gates(self) -> Path:
        return self.root / "gates"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    def build_dir(self, build_id: str) -> Path:
        return self.builds / build_id

    def run_dir(self, build_id: str, suite: str) -> Path:
        return self.runs / build_id / suite

    def gate_dir(self, gate_id: str) -> Path:
        return self.gates / gate_id
