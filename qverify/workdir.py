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


def resolve_build(workdir: Workdir, ref: str | Path):
    """A build id under <workdir>/builds/ (or a unique prefix of one), or a build directory.

    Returns (build_dir, BuildManifest). A plain HF model dir without build.json is refused:
    every evaluated artifact must carry a manifest.
    """
    from qverify.errors import BadInput
    from qverify.models import BuildManifest

    p = Path(ref)
    if not (p / "build.json").exists():
        cand = workdir.builds / str(ref)
        if (cand / "build.json").exists():
            p = cand
        else:
            matches = [d for d in workdir.builds.glob(f"{ref}*") if (d / "build.json").exists()] if workdir.builds.exists() else []
            if len(matches) == 1:
                p = matches[0]
            else:
                known = sorted(d.name for d in workdir.builds.glob("*") if (d / "build.json").exists()) if workdir.builds.exists() else []
                raise BadInput(f"no build {str(ref)!r} in {workdir.builds}" + (" (ambiguous prefix)" if matches else ""),
                               fix=f"run `qverify builds` to list them ({len(known)} known) or `qverify build --recipe NAME`")
    try:
        return p, BuildManifest.model_validate_json((p / "build.json").read_text())
    except ValueError as e:
        raise BadInput(f"{p / 'build.json'} is not a valid build manifest: {str(e).splitlines()[0]}",
                       fix="rebuild it with `qverify build --force`") from None
