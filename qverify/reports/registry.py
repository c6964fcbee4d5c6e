"""The model registry: a PASSing build becomes a model version; `release-candidate` moves to it.

A build's weights live outside MLflow (the workdir, or wherever it is deployed from), so
each version comes from an external logged model (MLflow 3's `create_external_model`).
Aliases and tags only: stages are deprecated. FAIL and INCONCLUSIVE are never registered.
Idempotent: a version already tagged with (gate id, build id) is reused, not duplicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qverify.reports.bundle import GateBundle
from qverify.reports.facts import build_facts

RC_ALIAS = "release-candidate"


@dataclass
class RegisteredVersion:
    name: str
    version: str
    build_id: str
    model_id: str | None
    alias: str | None = None


def registered_model_name(model: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-")
    return name if name.startswith("qverify") else f"qverify-{name}"


def _ensure_registered_model(client, name: str, model: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        client.create_registered_model(name, tags={"qverify.model": model},
                                       description=f"Serving builds of {model} that passed a qverify gate.")


def _release_choice(bundle: GateBundle, passing: list[str]) -> str:
    """Among PASSing builds the one that buys the most: fewest KV bytes per token, then smallest weights."""
    facts = {f.build_id: f for f in build_facts(bundle)}
    order = {b: i for i, b in enumerate(passing)}
    key = lambda b: (facts[b].kv_bytes_per_token or 2**62, facts[b].weights_bytes or 2**62, order[b])
    return min(passing, key=key)


def register_passing(client, bundle: GateBundle, experiment_id: str, gate_run_id: str,
                     build_runs: dict[str, str]) -> list[RegisteredVersion]:
    import mlflow

    passing = [c for c in bundle.gate.candidates if c.verdict == "PASS"]
    if not passing:
        return []
    name = registered_model_name(bundle.model)
    _ensure_registered_model(client, name, bundle.model)
    out: list[RegisteredVersion] = []
    for c in passing:
        tags = {"gate": "passed", "build_id": c.build_id, "gate_id": bundle.gate_id, "gate_run_id": gate_run_id,
                "recipe": c.recipe, "baseline": bundle.gate.baseline}
        found = client.search_model_versions(
            f"name = '{name}' and tags.build_id = '{c.build_id}' and tags.gate_id = '{bundle.gate_id}'")
        if found:
            mv = found[0]
            client.set_model_version_tag(name, mv.version, "gate_run_id", gate_run_id)
        else:
            run_id = build_runs.get(c.build_id) or gate_run_id
            lm = mlflow.create_external_model(
                name=f"{c.recipe}-{c.build_id[:12]}", source_run_id=run_id, experiment_id=experiment_id,
                model_type="serving-build", tags={"build_id": c.build_id, "recipe": c.recipe, "gate_id": bundle.gate_id},
                params={"build_id": c.build_id, "recipe": c.recipe, "baseline": bundle.gate.baseline})
            mv = client.create_model_version(
                name, source=lm.model_uri, run_id=run_id, tags=tags, model_id=lm.model_id,
                description=f"{c.recipe} build {c.build_id}: PASS in gate {bundle.gate_id} against {bundle.gate.baseline_recipe}.")
        out.append(RegisteredVersion(name=name, version=str(mv.version), build_id=c.build_id,
                                     model_id=getattr(mv, "model_id", None)))
    chosen = _release_choice(bundle, [c.build_id for c in passing])
    for v in out:
        if v.build_id == chosen:
            client.set_registered_model_alias(name, RC_ALIAS, v.version)
            v.alias = RC_ALIAS
    return out
