"""Calibration text: the suites' train split in the chat format, or a local file; fingerprints track content."""

from __future__ import annotations

import json

import pytest

from qverify.chatfmt import IM_END
from qverify.errors import BadInput
from qverify.quantize.calibration import load_calibration, to_dataset


def test_default_mixes_suites_in_chat_format():
    c = load_calibration(None, 9, 256)
    assert c.source == "mix" and len(c.texts) == 9
    assert all(t.startswith("<|im_") and t.endswith(IM_END) for t in c.texts)
    assert any("<|tool_call" in t or "<|im_system|>tools" in t for t in c.texts)  # tool-call shaped text is in
    assert len({t for t in c.texts}) == 9


def test_fingerprint_is_stable_and_tracks_content():
    a, b = load_calibration("mix", 6, 128), load_calibration("mix", 6, 128)
    assert a.fingerprint == b.fingerprint
    assert load_calibration("mix", 7, 128).fingerprint != a.fingerprint
    assert load_calibration("mix", 6, 256).fingerprint != a.fingerprint
    assert load_calibration("coding", 6, 128).fingerprint != a.fingerprint


def test_jsonl_file_with_text_and_messages(tmp_path):
    p = tmp_path / "calib.jsonl"
    rows = [{"text": "hello world"}, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    c = load_calibration(str(p), 10, 64)
    assert c.texts[0] == "hello world" and "<|im_user|>user<|im_middle|>hi" in c.texts[1]
    assert c.describe()["samples"] == 2


def test_parquet_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "calib.parquet"
    pq.write_table(pa.table({"text": ["a b c", "d e f", "g"]}), p)
    c = load_calibration(str(p), 2, 64)
    assert c.texts == ["a b c", "d e f"]


def test_bad_inputs(tmp_path):
    with pytest.raises(BadInput, match="neither a suite"):
        load_calibration("wikitext", 4, 64)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(BadInput, match=r"bad.jsonl:2:"):
        load_calibration(str(bad), 4, 64)
    empty = tmp_path / "e.jsonl"
    empty.write_text('{"foo": 1}\n')
    with pytest.raises(BadInput, match="no 'text'"):
        load_calibration(str(empty), 4, 64)


def test_to_dataset_truncates_to_seq_len(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ds = to_dataset(load_calibration("longctx", 3, 32), tok)
    assert len(ds) == 3 and max(len(x) for x in ds["input_ids"]) == 32
