"""`qverify gate`: PASS / FAIL / INCONCLUSIVE for candidate builds against run-to-run noise.

Exit codes: 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 the gate refused (runs incomplete or not
comparable) or infrastructure broke. The rule is in docs/gate.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qverify.commands._common import (
    BaselineOpt,
    ConfigOpt,
    RecipeOpt,
    SeedSaltOpt,
    SuitesOpt,
    TrackingUriOpt,
    TrustOpt,
    state,
)


def _check_budget(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    """--budget is read before anything is built or evaluated: a typo never costs a build."""
    if value is not None and not ctx.resilient_parsing:
        from qverify.config import parse_budget

        parse_budget(value)
    return value


def gate_cmd(
    ctx: typer.Context,
    baseline: BaselineOpt = None,
    candidate: Annotated[list[str] | None, typer.Option("--candidate", help="candidate (the same forms); repeat for several")] = None,
    recipe: RecipeOpt = None,  # built, evaluated and gated against the config's baseline
    config: ConfigOpt = None,
    suites: SuitesOpt = None,
    budget: Annotated[str | None, typer.Option("--budget", callback=_check_budget, help="gate in rounds within this budget: a request count "
                                                            "(default: sized from the suites' tolerances) or a time (10m, 90s: its looks "
                                                            "then depend on the machine's speed); stops when decided, resumes")] = None,
    fixed: Annotated[bool, typer.Option("--fixed", help="one look at the runs as they are (the fixed-size gate); refused on runs "
                                                        "grown since an earlier fixed gate left them INCONCLUSIVE")] = False,
    family_wise: Annotated[bool, typer.Option("--family-wise", help="several candidates: test each at alpha/m "
                                                                   "(Bonferroni), so picking whichever PASSes keeps a "
                                                                   "false PASS <= alpha")] = False,
    seed_salt: SeedSaltOpt = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="skip the MLflow upload and review report")] = False,
    tracking_uri: TrackingUriOpt = None,
    trust_remote_code: TrustOpt = False,
) -> None:
    """Decide PASS / FAIL / INCONCLUSIVE against run-to-run noise."""
    from qverify.config import load_config
    from qverify.gate import exit_code
    from qverify.rounds import GateAsk, gate, upload_gate

    s = state(ctx)
    cfg = load_config(Path(config) if config else None)
    if seed_salt is not None:
        cfg = cfg.model_copy(update={"seed_salt": seed_salt})
    if family_wise:
        cfg = cfg.model_copy(update={"family_wise": True})
    if trust_remote_code:
        cfg = cfg.model_copy(update={"trust_remote_code": True})
    names = [x.strip() for x in suites.split(",") if x.strip()] if suites else None
    ask = GateAsk(baseline=baseline, candidates=tuple(candidate or ()), recipe=recipe, suites=names, budget=budget,
                  fixed=fixed)
    report = gate(s.workdir, cfg, ask, out=s.out, verbose=s.verbose)
    # gate.json is written (rounds.gate) and the upload done before anything is printed: a reader that closes the
    # pipe early (`| head -1`) ends the printing (exit 141), never the upload
    code = exit_code(report)
    if cfg.report and not no_report:
        # a tracking failure never changes the verdict; it only turns a PASS's exit code into 3 (infrastructure)
        rc = upload_gate(s.workdir, report, tracking_uri or cfg.tracking_uri, s.out)
        if rc and code == 0:
            code = rc
    if s.out.json_mode:
        s.out.data(report.model_dump(mode="json"))
    else:
        _show(report, s.out.console)
        s.out.info(f"wrote {s.workdir.gate_report_path(report.gate_id)}")
    raise typer.Exit(code)


def _show(report, console) -> None:
    from qverify.gate.render import render, render_compact, render_looks
    from qverify.output import PLAIN_WIDTH

    if console.is_terminal:
        render(report, console)
    else:  # piped: README's one width promise for non-TTY output
        render_compact(report, console, width=PLAIN_WIDTH)
    render_looks(report, console)


def register(app: typer.Typer) -> None:
    app.command("gate", help="Decide PASS / FAIL / INCONCLUSIVE against run-to-run noise. --recipe NAME builds, "
                "evaluates and gates one recipe against qverify.toml's baseline.")(gate_cmd)
