"""verifier: K2-Vendor-Verifier-style checks on tool-call requests at production sampling.

Per item: finish reason, schema validity of calls, output hygiene. The trigger-F1
against the baseline (K2VV's ToolCall-Trigger Similarity) needs both builds'
responses, so it is computed at gate time from `tool_call_finish` (qverify.gate).
"""

from __future__ import annotations

import re
from typing import ClassVar

from qverify.chatfmt import MARKUP, SPECIAL_TOKENS
from qverify.models import Item, Response, Sampling, Score
from qverify.suites.base import Split, Suite, suites
from qverify.suites.metric_spec import MetricSpec
from qverify.suites.toolcall import check_calls, generate_toolcall_items

FINISH = ("stop", "tool_calls", "length")
_LEAK = re.compile("|".join(re.escape(t) for t in {*MARKUP, *SPECIAL_TOKENS, "<|im_start|>", "<|endoftext|>"}))


def has_repetition_loop(text: str, min_unit: int = 4, repeats: int = 4) -> bool:
    """True when some unit of >= min_unit chars repeats >= `repeats` times back to back."""
    return bool(re.search(rf"(.{{{min_unit},}}?)\1{{{repeats - 1},}}", text, re.DOTALL))


def hygiene(response: Response) -> dict[str, float]:
    content = response.content or ""
    return {
        "hygiene/empty": float(not content.strip() and not response.tool_calls),
        "hygiene/leaked_markup": float(bool(_LEAK.search(content))),
        "hygiene/truncated": float(response.finish_reason == "length"),
        "hygiene/repetition": float(has_repetition_loop(content)),
    }


# K2VV's bar sits 2.81 points under the lowest F1 between official runs (75.81% -> 73%).
K2VV_MARGIN = 0.03


@suites.register("verifier")
class VerifierSuite(Suite):
    name = "verifier"
    version = "1"
    description = "K2VV-style: finish reasons, tool-call schema accuracy, output hygiene, trigger-F1 vs baseline."
    primary_metric = "schema_accuracy"
    gate_metrics = (
        MetricSpec("verifier/trigger_f1", "verifier", "tool_call_finish", statistic="trigger_f1",
                   floor_margin=K2VV_MARGIN, doc="K2VV ToolCall-Trigger Similarity vs the baseline's runs"),
        MetricSpec("verifier/schema_accuracy", "verifier", "schema_accuracy", zero_unless="tool_call_finish",
                   doc="K2VV ToolCall-Schema Accuracy, an answer without a tool call counting as wrong"),
        # 0.02: a policy choice (not derived), two points more empty, leaked or truncated answers, the size of
        # the infrastructure-error budget a run may carry (qverify.config.ERROR_BUDGET)
        MetricSpec("verifier/hygiene/*", "verifier", "hygiene/*", direction="lower", tolerance=0.02,
                   doc="empty / leaked markup / truncated / repetition rates"),
        MetricSpec("verifier/finish/length", "verifier", "finish/length", direction="lower", gated=False),
        MetricSpec("verifier/finish/other", "verifier", "finish/other", direction="lower", gated=False),
    )
    # K2VV samples at 1.0 for thinking models and 0.6 otherwise; 1.0 stresses hygiene hardest.
    sampling: ClassVar[Sampling] = Sampling(temperature=1.0, top_p=1.0, max_tokens=96)
    default_n = 60
    pairwise = True

    def items(self, split: Split = "test", n: int | None = None, seed: int = 0, source: str = "synthetic") -> list[Item]:
        # same generator as toolcall, another seed: verifier items are fresh tool-call requests
        return generate_toolcall_items(self.name, split, n or self.default_n, seed + 1000)

    def score(self, item: Item, response: Response) -> Score:
        fr = response.finish_reason if response.finish_reason in FINISH else "other"
        values = {f"finish/{f}": float(fr == f) for f in (*FINISH, "other")}
        values["tool_call_finish"] = float(fr == "tool_calls")
        values.update(hygiene(response))
        reason = None
        if fr == "tool_calls":
            check = check_calls(item, response)
            ok = bool(check["valid"]) and all(check["valid"])
            values["schema_accuracy"] = float(ok)
            reason = None if ok else "; ".join(check["reasons"]) or "no parsable call"
        bad = [k for k, v in values.items() if k.startswith("hygiene/") and v]
        if bad:
            reason = ", ".join(bad) if reason is None else f"{reason}; {', '.join(bad)}"
        return Score(values=values, reason=reason)
