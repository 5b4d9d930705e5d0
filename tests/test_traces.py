"""Trace loaders: exact values from small fixtures, every malformed-row case, and the real traces."""

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.errors import KvsimError
from kvsim.scenario.config import scenario_from_dict
from kvsim.scenario.trace_rows import MOONCAKE_BLOCK_SIZE, VOCAB_SIZE, block_token_ids
from kvsim.scenario.trace_rows import NotPlain
from kvsim.scenario.traces import azure_by_rows, azure_in_bulk, load_azure, load_csv, load_mooncake, load_trace

FIXTURES = Path(__file__).parent / "fixtures"
MALFORMED = FIXTURES / "malformed"
REAL = Path(__file__).resolve().parents[1] / "traces"  # the shipped copies (traces/README.md)
LOADERS = {"azure": load_azure, "mooncake": load_mooncake, "csv": load_csv}


def trace_scenario(fmt, path, base_dir=FIXTURES, **trace):
    return scenario_from_dict({
        "model": {"name": "m"}, "policies": [{"name": "p"}],
        "workload": {"arrival": {"process": "trace"}, "prompt_len": {"dist": "trace"},
                     "output_len": {"dist": "trace"}, "trace": {"format": fmt, "path": str(path), **trace}},
    }, "scn.toml", base_dir)


def test_azure_fixture_exact():
    t = load_azure(FIXTURES / "azure_small.csv")
    # 18:15:46.6805900 is the origin; the last is one minute and 100 ns later.
    np.testing.assert_allclose(t.arrival_s, [0.0, 4.314579, 4.541877, 60.0000001], rtol=0, atol=1e-9)
    assert t.prompt_len.tolist() == [374, 396, 879, 91]
    assert t.output_len.tolist() == [44, 109, 1, 16]  # 0 generated tokens is read as 1
    assert t.arrival_s.dtype == np.float64 and t.hash_ids is None and t.token_ids(0) is None


def test_csv_fixture_sorted_stably():
    t = load_csv(FIXTURES / "generic_small.csv")
    assert t.arrival_s.tolist() == [0.0, 0.5, 1.0, 1.0]
    assert t.prompt_len.tolist() == [200, 400, 100, 300]  # the two 1.5 s rows keep file order
    assert t.output_len.tolist() == [20, 40, 10, 30]


def test_mooncake_fixture_exact_and_reordered():
    t = load_mooncake(FIXTURES / "mooncake_small.jsonl")
    assert t.arrival_s.tolist() == [0.0, 0.25, 0.5, 1.0, 1.0]
    assert t.prompt_len.tolist() == [1100, 1500, 512, 10, 600]
    assert t.output_len.tolist() == [5, 7, 3, 1, 2]
    blocks = [t.hash_ids[s:e].tolist() for s, e in zip(t.hash_start, t.hash_end)]
    assert blocks == [[0, 1, 2], [0, 1, 3], [0], [4], [0, 5]]


def test_mooncake_shared_blocks_give_shared_tokens():
    t = load_mooncake(FIXTURES / "mooncake_small.jsonl")
    a, b, only0, d = t.token_ids(0), t.token_ids(1), t.token_ids(2), t.token_ids(4)
    assert len(a) == 1100 and len(b) == 1500 and len(t.token_ids(3)) == 10
    k = 2 * MOONCAKE_BLOCK_SIZE  # rows 0 and 1 share hash ids [0, 1]
    assert np.array_equal(a[:k], b[:k])
    assert np.mean(a[k:1100] == b[k:1100]) < 0.01  # blocks 2 vs 3: independent tokens
    assert np.array_equal(only0, a[:512]) and np.array_equal(d[:512], a[:512])
    assert np.mean(d[512:600] == a[512:600]) < 0.05
    assert a.dtype == np.int32 and not a.flags.writeable


def test_block_token_ids_range_and_independence():
    ids = np.arange(2000)
    tokens = block_token_ids(ids)
    assert tokens.shape == (2000 * MOONCAKE_BLOCK_SIZE,) and tokens.dtype == np.int32
    assert tokens.min() >= 0 and tokens.max() < VOCAB_SIZE
    # Uniform over the vocabulary: each id about 32 times; chi-square far below a broken hash's.
    counts = np.bincount(tokens, minlength=VOCAB_SIZE)
    expected = len(tokens) / VOCAB_SIZE
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert abs(chi2 - VOCAB_SIZE) < 6 * math.sqrt(2 * VOCAB_SIZE)
    # Same id at a different place in a list: same tokens; neighbouring ids: unrelated tokens.
    assert np.array_equal(block_token_ids([7, 8])[512:], block_token_ids([8]))
    assert np.mean(block_token_ids([7]) == block_token_ids([8])) < 0.01
    assert np.array_equal(block_token_ids([2**62 + 5]), block_token_ids(np.array([2**62 + 5])))


MALFORMED_CASES = [
    ("azure", "azure_hour25.csv", 3, "bad timestamp in TIMESTAMP: '2023-11-16 25:15:50.9951690'"),
    ("azure", "azure_text_time.csv", 2, "bad timestamp in TIMESTAMP: 'yesterday'"),
    ("azure", "azure_nonint.csv", 4, "ContextTokens is not an integer: 'x'"),
    ("azure", "azure_negative.csv", 2, "GeneratedTokens must be positive: -3"),
    ("azure", "azure_missing_col.csv", 3, "missing column 'GeneratedTokens'"),
    ("azure", "azure_bad_header.csv", 1, "missing column 'ContextTokens' in header"),
    ("csv", "csv_zero_prompt.csv", 3, "prompt_tokens must be positive: 0"),
    ("csv", "csv_zero_output.csv", 2, "output_tokens must be positive: 0"),
    ("csv", "csv_float_tokens.csv", 2, "prompt_tokens is not an integer: '12.5'"),
    ("csv", "csv_bad_arrival.csv", 4, "bad timestamp in arrival_s: 'soon'"),  # after a blank line 3
    ("csv", "csv_nan_arrival.csv", 3, "bad timestamp in arrival_s: 'nan'"),
    ("mooncake", "mooncake_bad_json.jsonl", 2, "bad JSON"),
    ("mooncake", "mooncake_missing_key.jsonl", 3, "missing column 'output_length'"),
    ("mooncake", "mooncake_hash_count.jsonl", 1, "hash_ids has 2 ids, input_length 1100 needs 3"),
    ("mooncake", "mooncake_zero_input.jsonl", 2, "input_length must be positive: 0"),
    ("mooncake", "mooncake_bad_timestamp.jsonl", 1, "bad timestamp in timestamp: 'noon'"),
    ("mooncake", "mooncake_float_len.jsonl", 1, "output_length is not an integer: 3.5"),
    ("mooncake", "mooncake_not_object.jsonl", 1, "bad JSON: expected an object"),
    ("mooncake", "mooncake_negative_hash.jsonl", 1, "hash_ids is not a list of non-negative integers"),
]


@pytest.mark.parametrize("fmt,name,line,reason", MALFORMED_CASES, ids=[c[1] for c in MALFORMED_CASES])
def test_malformed_row_names_file_and_line(fmt, name, line, reason):
    path = MALFORMED / name
    with pytest.raises(KvsimError) as err:
        LOADERS[fmt](path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert reason in msg and "\n" not in msg


def test_empty_trace_is_an_error():
    with pytest.raises(KvsimError, match="trace has no requests"):
        load_csv(MALFORMED / "csv_empty.csv")


def test_missing_file_names_scenario_key_and_path(tmp_path):
    sc = trace_scenario("csv", "nope.csv", base_dir=tmp_path)
    with pytest.raises(KvsimError) as err:
        load_trace(sc)
    assert str(err.value) == f"scn.toml: workload.trace.path: file not found: {tmp_path / 'nope.csv'}"


def test_load_trace_resolves_relative_path_caches_and_cuts():
    sc = trace_scenario("mooncake", "mooncake_small.jsonl")
    first = load_trace(sc)
    assert load_trace(sc) is first  # parsed once
    cut = load_trace(trace_scenario("mooncake", "mooncake_small.jsonl", max_requests=2))
    assert len(cut) == 2 and cut.prompt_len.tolist() == [1100, 1500]
    assert np.array_equal(cut.token_ids(1), first.token_ids(1))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 10**6), st.integers(1, 10**6)), min_size=1, max_size=30))
def test_csv_matches_stable_sort_reference(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{a / 4},{p},{o}\n" for a, p, o in rows))
    t = load_csv(path)
    ref = sorted(rows, key=lambda r: r[0])  # Python's sort is stable
    assert t.arrival_s.tolist() == [(a - ref[0][0]) / 4 for a, _, _ in ref]
    assert t.prompt_len.tolist() == [p for _, p, _ in ref]
    assert t.output_len.tolist() == [o for _, _, o in ref]


GOOD_STAMPS = ["2023-11-16 18:15:46.6805900", "2023-11-16T18:15:50", "2023-11-16 18:15:46.123456789",
               "1900-01-01 00:00:00", "2200-12-31 23:59:59.9", " 2023-11-16 18:15:47 "]
BAD_STAMPS = ["1899-12-31 23:59:59", "2201-01-01 00:00:00", "2023-13-01 00:00:00", "2023-11-16", "2023-11-16T18:15Z",
              "\u0662\u0660\u0662\u0663-11-16 18:15:46", "", "2023-11-16 18:15:46.1234567890"]
GOOD_LENS = ["374", "1", "+5", " 7 ", "1000000"]
BAD_LENS = ["0", "-1", "1e3", "10000000000", "", "\u0663", "1_000"]


@st.composite
def azure_files(draw):
    """A header and rows, clean (what the bulk reader must take) or with some odd field, row or line end."""
    clean = draw(st.booleans())
    stamps = st.sampled_from(GOOD_STAMPS if clean else GOOD_STAMPS + BAD_STAMPS)
    lens = st.sampled_from(GOOD_LENS if clean else GOOD_LENS + BAD_LENS)
    extras = st.sampled_from([""] if clean else ["", ",x", ',"q"', "\r", ",,"])
    ends = st.sampled_from(["\n", "\r\n"] if clean else ["\n", "\r\n", "\n\n"])
    header = draw(st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", "GeneratedTokens, TIMESTAMP ,ContextTokens,extra"]
                                  + ([] if clean else ["TIMESTAMP,ContextTokens", '"TIMESTAMP",ContextTokens,GeneratedTokens'])))
    names = [h.strip() for h in header.replace('"', "").split(",")]
    lines = []
    for _ in range(draw(st.integers(0 if not clean else 1, 12))):
        value = {"TIMESTAMP": draw(stamps), "ContextTokens": draw(lens), "GeneratedTokens": draw(lens) if clean
                 else draw(st.sampled_from(GOOD_LENS + BAD_LENS)), "extra": "e"}
        lines.append(",".join(value[n] for n in names) + draw(extras) + draw(ends))
    return clean, header + "\n" + "".join(lines)


@settings(max_examples=300, deadline=None)
@given(azure_files())
def test_azure_bulk_reads_what_rows_read(tmp_path_factory, case):
    """Whatever the bulk reader takes, the row-by-row reader takes with the same values (and a clean
    file it takes); load_azure gives the row reader's trace or error either way."""
    clean, text = case
    path = tmp_path_factory.mktemp("azure") / "t.csv"
    path.write_bytes(text.encode())
    try:
        want = azure_by_rows(path)
    except KvsimError as exc:
        want = str(exc)
    try:
        bulk = azure_in_bulk(path)
    except NotPlain:
        bulk = None
    assert bulk is not None or not clean
    if bulk is not None:
        assert not isinstance(want, str), want
        for field in ("arrival_s", "prompt_len", "output_len"):
            assert getattr(bulk, field).tobytes() == getattr(want, field).tobytes()
    try:
        got = load_azure(path)
    except KvsimError as exc:
        got = str(exc)
    if isinstance(want, str):
        assert got == want
    else:
        assert all(getattr(got, f).tobytes() == getattr(want, f).tobytes() for f in ("arrival_s", "prompt_len", "output_len"))


def test_azure_bulk_reads_the_plain_fixture_and_across_chunks(tmp_path, monkeypatch):
    from kvsim.scenario import files

    assert azure_in_bulk(FIXTURES / "azure_small.csv").prompt_len.tolist() == [374, 396, 879, 91]
    rows = "".join(f"2023-11-16 18:{m:02d}:{s:02d}.5,{m * 60 + s + 1},{s}\r\n" for m in range(60) for s in range(60))
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + rows)
    monkeypatch.setattr(files, "CHUNK_BYTES", 1000)  # many chunks, each ending mid-way in the file
    monkeypatch.setattr(files.iter_text_chunks, "__defaults__", (1000, files.MAX_LINE_BYTES))
    bulk, ref = azure_in_bulk(path), azure_by_rows(path)
    assert bulk.prompt_len.tolist() == list(range(1, 3601))
    assert all(getattr(bulk, f).tobytes() == getattr(ref, f).tobytes() for f in ("arrival_s", "prompt_len", "output_len"))


def test_real_azure_trace():
    t = load_azure(REAL / "azure_llm_2023_conv.csv")
    assert len(t) == 19366 and t.arrival_s[0] == 0.0
    assert np.all(np.diff(t.arrival_s) >= 0) and 3400 < t.arrival_s[-1] < 3600  # about one hour
    assert t.prompt_len.min() >= 1 and t.output_len.min() >= 1


def test_real_mooncake_trace():
    t = load_mooncake(REAL / "mooncake_conversation.jsonl")
    assert len(t) == 12031 and t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)
    need = -(-t.prompt_len // MOONCAKE_BLOCK_SIZE)
    assert np.array_equal(t.hash_end - t.hash_start, need)
    assert len(t.token_ids(0)) == t.prompt_len[0]
