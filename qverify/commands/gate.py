"""`qverify gate`: PASS / FAIL / INCONCLUSIVE for candidate builds against run-to-run noise.

Exit codes: 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 the gate refused (runs incomplete or not
comparable) or infrastructure broke. The rule is in docs/gate.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qverify.commands._common import BUILD_REF_HELP, SEED_SALT_HELP, ConfigOpt, JsonOpt, SeedSalt, state


def _check_budget(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """--budget is read before anything is built or evaluated: a typo never costs a build."""
    if value is not None and not ctx.resilient_parsing:
        from qverify.config import parse_budget

        parse_budget(value)
    return value


def gate_cmd(
    ctx: typer.Context,
    baseline: Annotated[str | None, typer.Option("--baseline", help="baseline: " + BUILD_REF_HELP)] = None,
    candidate: Annotated[list[str] | None, typer.Option("--candidate", help="candidate (the same forms); repeat for several")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="build + eval + gate this recipe against the config's baseline")] = None,
    config: ConfigOpt = None,
    suites: Annotated[str | None, typer.Option("--suites", help="comma-separated suites (default: the config's that the baseline ran)")] = None,
    json_out: JsonOpt = False,  # the GateReport
    budget: Annotated[str | None, typer.Option("--budget", callback=_check_budget, help="gate in rounds within this budget: a request count "
                                                            "(default: sized from the suites' tolerances) or a time (10m, 90s: its looks "
                                                            "then depend on the machine's speed); stops when decided, resumes")] = None,
    fixed: Annotated[bool, typer.Option("--fixed", help="one look at the runs as they are (the fixed-size gate); refused on runs "
                                                        "grown since an earlier fixed gate left them INCONCLUSIVE")] = False,
    family_wise: Annotated[bool, typer.Option("--family-wise", help="several candidates: test each at alpha/m "
                                                                   "(Bonferroni), so picking whichever PASSes keeps a "
                                                                   "false PASS <= alpha")] = False,
    seed_salt: Annotated[int | None, typer.Option("--seed-salt", callback=SeedSalt, help=SEED_SALT_HELP + " (for the runs "
                                                  "this gate evaluates)")] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="skip the MLflow upload and review report")] = False,
    tracking_uri: Annotated[str | None, typer.Option("--tracking-uri", help="MLflow tracking URI (default: sqlite in the workdir)")] = None,
) -> None:
    """Decide PASS / FAIL / INCONCLUSIVE against run-to-run noise."""
    from qverify.config import load_config
    from qverify.gate import exit_code
    from qverify.rounds import GateAsk, gate, upload_gate

    s = state(ctx)
    if json_out:
        s.out.json_mode = True
    cfg = load_config(Path(config) if config else None)
    if seed_salt is not None:
        cfg = cfg.model_copy(update={"seed_salt": seed_salt})
    if family_wise:
        cfg = cfg.model_copy(update={"family_wise": True})
    names = [x.strip() for x in suites.split(",") if x.strip()] if suites else None
    ask = GateAsk(baseline=baseline, candidates=tuple(candidate or ()), recipe=recipe, suites=names, budget=budget,
                  fixed=fixed)
    report = gate(s.workdir, cfg, ask, out=s.out, verbose=s.verbose)
    _print(s, report)
    code = exit_code(report)
    if cfg.report and not no_report:
        rc = upload_gate(s.workdir, report, tracking_uri or cfg.tracking_uri, s.out)
        if rc and code == 0:
            code = rc
    raise typer.Exit(code)


def _print(s, report) -> None:
    from qverify.gate.render import render, render_looks

    if s.out.json_mode:
        s.out.data(report.model_dump(mode="json"))
    else:
        render(report, s.out.console)
        render_looks(report, s.out.console)
        s.out.info(f"wrote {s.workdir.gate_report_path(report.gate_id)}")


def register(app: typer.Typer) -> None:
    app.command("gate", help="Decide PASS / FAIL / INCONCLUSIVE against run-to-run noise.")(gate_cmd)
