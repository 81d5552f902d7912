"""Hand-corrupted evaluation traces are refused where they are parsed, with a ConfigError naming file:line and
the field -- never a KeyError, a numpy UFuncNoLoopError or a ZeroDivisionError out of ``report``.

Also: a ``.gz`` that is not gzip (or is cut short), and a directory named like a shard.
"""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from mindspore_eagle.app import cli
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.evaluation.report import load, report
from mindspore_eagle.evaluation.trace import read_trace
from tests.helpers import legacy_step_record, turn_record

HEADER = {"record": "run", "config": {"max_new_tokens": 12}, "rank": 0, "world": 1, "selected": []}


def write_trace(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def good():
    return [copy.deepcopy(HEADER), legacy_step_record("humaneval-000", 0, 1.0), turn_record("humaneval-000", "humaneval", 1.0, 2.0, 2.0, 4, 8),
            turn_record("humaneval-001", "humaneval", 2.0, 2.0, 1.0, 2, 8)]


def test_the_untouched_trace_reads_and_reports(tmp_path):
    r = report(load([write_trace(tmp_path / "t.jsonl", good())]))
    assert r["turns"] == 2


@pytest.mark.parametrize("line, change, needle", [
    (3, lambda d: d.pop("output_ids"), "turn record: missing field 'output_ids'"),
    (3, lambda d: d.update(speedup="fast"), "turn record: speedup='fast': must be a finite number >= 0"),
    (3, lambda d: d.update(greedy_s=0), "turn record: greedy_s=0: must be a finite number > 0"),
    (3, lambda d: d.update(spec_s=-1.0), "turn record: spec_s=-1.0: must be a finite number > 0"),
    (3, lambda d: d.update(cycles=2.5), "turn record: cycles=2.5: must be an integer >= 0"),
    (3, lambda d: d.update(lossless="yes"), "turn record: lossless='yes': must be true or false"),
    (3, lambda d: d.update(output_ids=[1, "x"]), "turn record: output_ids=\\[1, 'x'\\]: must be a list of integers >= 0"),
    (3, lambda d: d.update(tau="NaN"), "turn record: tau='NaN': must be a finite number >= 0 or null"),
    (3, lambda d: d.update(turn=7), "turn record: turn=7: must be a string"),
    (2, lambda d: d.pop("turn"), "step record: missing field 'turn'"),
    (2, lambda d: d.update(path=None), "step record: path=None: must be a list of integers >= 0"),
    (2, lambda d: d.update(draft_ms=[1]), "step record: draft_ms=\\[1\\]: must be a finite number >= 0"),
    (1, lambda d: d.update(config=[1]), "run record: config=\\[1\\]: must be an object"),
])
def test_a_record_with_a_wrong_schema_names_file_line_and_field(tmp_path, line, change, needle):
    records = good()
    change(records[line - 1])
    path = write_trace(tmp_path / "t.jsonl", records)
    with pytest.raises(ConfigError, match=f"t.jsonl:{line}: {needle}"):
        read_trace(path)


def test_report_cli_on_a_wrong_schema_exits_2_with_the_reason(tmp_path, capsys):
    records = good()
    records[2]["greedy_s"] = 0  # used to be a ZeroDivisionError out of the report
    records[3]["greedy_s"] = 0
    path = write_trace(tmp_path / "t.jsonl", records)
    assert cli.main(["report", path, "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:3: turn record: greedy_s=0" in err and "Traceback" not in err


@pytest.mark.parametrize("content", [b"this is not gzip at all\n", "cut"])
def test_a_bad_gz_trace_is_a_config_error_naming_the_file(tmp_path, content):
    path = tmp_path / "merged.jsonl.gz"
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in good()).encode())
    path.write_bytes(content if isinstance(content, bytes) else data[: len(data) // 2])
    with pytest.raises(ConfigError, match="merged.jsonl.gz: not a readable trace"):
        read_trace(str(path))


def test_a_directory_named_like_a_shard_is_named(tmp_path):
    write_trace(tmp_path / "shard-0.jsonl", good())
    (tmp_path / "shard-1.jsonl").mkdir()
    with pytest.raises(ConfigError, match="shard-1.jsonl: is a directory, not a trace file"):
        load([str(tmp_path)])
    with pytest.raises(ConfigError, match="shard-1.jsonl: not a readable trace"):
        read_trace(str(tmp_path / "shard-1.jsonl"))
