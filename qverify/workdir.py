"""The workdir layout (README, "Workdir"): builds/, runs/, gates/, logs/, mlflow.db.

The only module that knows folder and file names on disk and the only one that parses
build.json: everything else asks a `Workdir` (or `read_build_manifest` for a build dir
given by path) for a path or a manifest.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qverify.errors import BadInput, refuse_special_files
from qverify.models import SAFE_NAME, BuildManifest

BUILD_MANIFEST = "build.json"
GATE_REPORT = "gate.json"
SEQUENCE_STATE = "sequence.json"


def open_nofollow(path: Path, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """os.open that never follows a symlink at `path` (O_NOFOLLOW): a file qverify writes or reads back in the
    workdir (results, quarantine, logs) is the file itself, never one it points to outside (a symlinked r0.jsonl
    had a file elsewhere truncated and overwritten with results). A symlink there is BadInput (exit 4)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BadInput(f"{path} is a symlink; qverify never reads or writes workdir files through links",
                           fix=f"remove the link `rm {path}` (qverify writes the file itself), or copy its target there")
        raise


def open_append(path: Path, text: bool = False):
    """A log or results file opened for appending, never through a symlink (open_nofollow)."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8") if text else os.fdopen(fd, "ab", buffering=0)


def is_regular_file(path: Path) -> bool:
    """A regular file itself, not a symlink to one (nor a FIFO, socket or device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def manifest_path(build_dir: Path) -> Path:
    return Path(build_dir) / BUILD_MANIFEST


def run_path(runs_root: Path, build_id: str, suite: str) -> Path:
    """runs/<build>/<suite>: one run's folder, for callers that hold the runs root rather than a Workdir."""
    return Path(runs_root) / build_id / suite


def sequence_path(gates_root: Path, seq_id: str) -> Path:
    """gates/seq-<id>/sequence.json: a budgeted gate's plan and looks (qverify.gate.budget)."""
    return Path(gates_root) / seq_id / SEQUENCE_STATE


def is_build(build_dir: Path) -> bool:
    """A finished qverify build: a directory with a build.json."""
    return manifest_path(build_dir).is_file()


def read_build_manifest(build_dir: Path) -> BuildManifest:
    """build.json of a build dir; OSError if missing, ValueError if invalid (callers word the error)."""
    return BuildManifest.model_validate_json(manifest_path(build_dir).read_text())


def read_build_manifest_dict(build_dir: Path) -> dict[str, Any]:
    """build.json as plain JSON, for readers that take any checkpoint and only look up a few keys."""
    return json.loads(manifest_path(build_dir).read_text())


@dataclass(frozen=True)
class Workdir:
    root: Path

    @classmethod
    def at(cls, path: str | Path | Workdir) -> Workdir:
        if isinstance(path, Workdir):
            return path
        root = Path(path).expanduser().resolve()
        return cls(root)

    def ensure(self) -> Workdir:
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

    def inside(self, base: Path, *parts: str) -> Path:
        """base/parts if it lies strictly inside `base` (builds/, runs/, gates/) once `..` and absolute parts are
        applied, else BadInput: names that reach us from build.json, recipes or the command line never write
        elsewhere. Symlinks are not followed: one inside the workdir was put there by its owner (a build kept on
        another disk), while `..` or `/` in a name comes from whoever wrote that name."""
        path = base.joinpath(*parts)
        top = Path(os.path.normpath(base))
        resolved = Path(os.path.normpath(path))
        if resolved == top or not resolved.is_relative_to(top):
            raise BadInput(f"{path} resolves outside {top}",
                           fix="use a build id or recipe name of letters, digits and . _ + - (no '/' or '..')")
        return path

    def build_dir(self, build_id: str) -> Path:
        return self.inside(self.builds, build_id)

    def build_manifest_path(self, build_id: str) -> Path:
        return manifest_path(self.build_dir(build_id))

    def run_dir(self, build_id: str, suite: str) -> Path:
        return self.inside(self.runs, build_id, suite)

    def gate_dir(self, gate_id: str) -> Path:
        return self.inside(self.gates, gate_id)

    def gate_report_path(self, gate_id: str) -> Path:
        return self.gate_dir(gate_id) / GATE_REPORT

    def gate_ids(self) -> list[str]:
        """Gates with a gate.json, by id."""
        return sorted(p.parent.name for p in self.gates.glob(f"*/{GATE_REPORT}")) if self.gates.is_dir() else []

    def build_manifest(self, build_id: str) -> BuildManifest | None:
        """The build's manifest, or None when it has no (valid) build.json."""
        try:
            return read_build_manifest(self.build_dir(build_id))
        except (OSError, ValueError):
            return None

    def build_dirs(self) -> list[Path]:
        """Finished builds (with build.json), by id; dot-dirs are temp dirs of running or killed builds."""
        if not self.builds.is_dir():
            return []
        return [d for d in sorted(self.builds.iterdir()) if not d.name.startswith(".") and is_build(d)]

    def resolve_build(self, ref: str | Path) -> tuple[Path, BuildManifest]:
        """The one resolver of a build reference, for every command that takes a build: a build directory,
        a build id under builds/, a unique prefix of one, or a recipe with exactly one build.

        Returns (build_dir, BuildManifest). A plain HF model dir without build.json is refused:
        every evaluated artifact must carry a manifest.
        """
        p = Path(ref)
        if not is_build(p) and not manifest_path(p).exists():  # exists(): a FIFO build.json is refused below
            # a name that is not one safe path component is never looked up under builds/ (no `..`, no `/`)
            cand = self.build_dir(str(ref)) if SAFE_NAME.fullmatch(str(ref)) else None
            p = cand if cand is not None and is_build(cand) else self._find_build(str(ref))
        _refuse_special_files(p)
        try:
            return p, read_build_manifest(p)
        except ValueError as e:
            raise BadInput(f"{manifest_path(p)} is not a valid build manifest: {str(e).splitlines()[0]}",
                           fix="rebuild it with `qverify build --force`") from None

    def _find_build(self, ref: str) -> Path:
        """A unique id prefix, else a recipe name with exactly one build."""
        dirs = self.build_dirs()
        matches = [d for d in dirs if d.name.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        by_recipe = [d for d in dirs if (m := self.build_manifest(d.name)) is not None and m.recipe == ref]
        if len(by_recipe) == 1:
            return by_recipe[0]
        if len(by_recipe) > 1:
            raise BadInput(f"recipe {ref!r} has {len(by_recipe)} builds: {', '.join(d.name for d in by_recipe)}",
                           fix="pass the build id instead of the recipe name")
        raise BadInput(f"no build {ref!r} in {self.builds}" + (" (ambiguous prefix)" if matches else ""),
                       fix=f"run `qverify builds` to list them ({len(dirs)} known) or `qverify build --recipe NAME`")

    def resolve_build_id(self, ref: str | Path) -> str:
        """The id a build's runs are filed under (runs/<id>/), from any reference resolve_build takes; a plain
        name with runs but no build dir (an endpoint's runs) is its own id."""
        name = str(ref)
        if SAFE_NAME.fullmatch(name) and ((self.runs / name).is_dir() or manifest_path(self.build_dir(name)).exists()):
            if self.build_dir(name).is_dir():
                _refuse_special_files(self.build_dir(name))
            return name
        return self.resolve_build(ref)[1].build_id


def _refuse_special_files(build_dir: Path) -> None:
    # a FIFO (build.json, config.json, a shard) would hang whatever reads it: refused before anything is opened
    refuse_special_files(build_dir.rglob("*"), f"build folder {build_dir}:", fix="a build folder holds files and folders only")
