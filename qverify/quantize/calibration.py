"""Calibration text for llm-compressor, built in-process: nothing is fetched from a hub.

Default: coding-agent-shaped text from the suites' *train* split (coding, tool calls,
long context), rendered with the source's own chat template when it ships one (a release's
`chat_template.jinja`, through transformers' renderer: what the served model sees), else with
qverify's Kimi-K2 chat format (qverify/chatfmt.py; qverify-tiny's template renders the same bytes). Alternatives: one suite's train split, or a local JSONL/parquet
file. The fingerprint hashes the selected texts and the sequence length, so it changes
exactly when what llm-compressor sees changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qverify.errors import BadInput

SUITES = ("coding", "toolcall", "longctx")
DEFAULT = "mix"


@dataclass(frozen=True)
class CalibrationSet:
    source: str  # "mix", a suite name, or a file path
    texts: list[str]
    seq_len: int

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256(f"seq_len={self.seq_len}\n".encode())
        for t in self.texts:
            h.update(hashlib.sha256(t.encode()).digest())
        return h.hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "fingerprint": self.fingerprint, "samples": len(self.texts),
                "seq_len": self.seq_len}


def _suite_texts(task: str, n: int, seq_len: int, template: str | None = None) -> list[str]:
    from qverify.chatfmt import IM_END
    from qverify.suites import get_suite, train_examples

    # Long-context items sized to roughly fill the sequence (chars ~ 3x tokens here).
    options = {"lengths": [max(128, min(seq_len, 1024))]} if task == "longctx" else {}
    if template is None:
        return [prompt + answer + IM_END for prompt, answer in train_examples(task, n, 0, **options)]
    suite = get_suite(task, **options)
    # The answer goes in as the assistant's content (tool calls as the text the model emits for them).
    return [_templated(template, i.messages + [{"role": "assistant", "content": suite.answer_text(i)}], i.tools)
            for i in suite.items("train", n, 0)]


def _templated(template: str, messages: list[dict], tools: list[dict] | None) -> str:
    """A conversation through the source's own chat template, rendered as transformers renders it."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                       add_generation_prompt=False)
    except TemplateError as e:
        raise BadInput(f"the source's chat template does not render a calibration conversation: {e}",
                       fix="fix chat_template.jinja, or pass --calib-data FILE with plain 'text' rows") from None
    return out[0]


def _render_row(row: dict[str, Any], where: str, template: str | None = None) -> str:
    from qverify.chatfmt import render_chat

    if isinstance(row.get("text"), str):
        return row["text"]
    if isinstance(row.get("messages"), list):
        if template is not None:
            return _templated(template, row["messages"], row.get("tools"))
        return render_chat(row["messages"], row.get("tools"), add_generation_prompt=False)
    if isinstance(row.get("prompt"), str):
        return row["prompt"] + str(row.get("answer") or "")
    raise BadInput(f"{where}: no 'text', 'messages' or 'prompt' field",
                   fix="give each row a 'text' string (or chat 'messages')")


def _file_texts(path: Path, template: str | None = None) -> list[str]:
    if path.suffix == ".jsonl":
        out = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInput(f"{path}:{i}:{e.colno}: malformed JSON line: {e.msg}", fix="one JSON object per line") from None
            if not isinstance(row, dict):
                raise BadInput(f"{path}:{i}: each line must be a JSON object", fix="one JSON object per line")
            out.append(_render_row(row, f"{path}:{i}", template))
        return out
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise BadInput(f"{path}: not a readable parquet file ({type(e).__name__})", fix="pass a valid .parquet file") from None
        return [_render_row(r, f"{path}: row {i}", template) for i, r in enumerate(rows)]
    raise BadInput(f"calibration file {path} must be .jsonl or .parquet", fix="convert it, or pass a suite name")


def load_calibration(spec: str | Path | None, samples: int, seq_len: int, chat_template: str | None = None) -> CalibrationSet:
    """`spec`: None/'mix' (default), a suite name (coding, toolcall, longctx), or a local file. `chat_template`: the
    source's own (`source_chat_template`), used to render chat rows."""
    if samples < 1 or seq_len < 8:
        raise BadInput(f"calibration needs samples >= 1 and seq_len >= 8 (got {samples}, {seq_len})",
                       fix="raise --calib-samples / --calib-seq-len")
    s = str(spec) if spec is not None else DEFAULT
    if s == DEFAULT:
        per = -(-samples // len(SUITES))
        pools = [_suite_texts(t, per, seq_len, chat_template) for t in SUITES]
        texts = [pools[i % len(SUITES)][i // len(SUITES)] for i in range(samples)]  # interleave tasks
        return CalibrationSet(DEFAULT, texts, seq_len)
    if s in SUITES:
        return CalibrationSet(s, _suite_texts(s, samples, seq_len, chat_template), seq_len)
    path = Path(s).expanduser()
    if not path.is_file():
        raise BadInput(f"calibration data {s!r} is neither a suite ({', '.join(SUITES)}) nor a file",
                       fix=f"pass --calib-data {DEFAULT}|{'|'.join(SUITES)}|PATH.jsonl|PATH.parquet")
    texts = [t for t in _file_texts(path, chat_template) if t.strip()]
    if not texts:
        raise BadInput(f"calibration file {path} has no text rows", fix="add rows with a 'text' field")
    return CalibrationSet(str(path.resolve()), texts[:samples], seq_len)


def source_chat_template(model_dir: Path) -> str | None:
    """The chat template a source ships: `chat_template.jinja`, else tokenizer_config.json's `chat_template` string."""
    path = Path(model_dir) / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    try:
        template = json.loads((Path(model_dir) / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return template if isinstance(template, str) else None


def to_dataset(calib: CalibrationSet, tokenizer):
    """Tokenize in-process into a `datasets.Dataset` (input_ids, attention_mask) for oneshot."""
    from datasets import Dataset

    enc = tokenizer(calib.texts, add_special_tokens=False, truncation=True, max_length=calib.seq_len)
    rows = [(ids, m) for ids, m in zip(enc["input_ids"], enc["attention_mask"]) if ids]
    return Dataset.from_dict({"input_ids": [r[0] for r in rows], "attention_mask": [r[1] for r in rows]})
