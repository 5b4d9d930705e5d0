"""The Validation page under AppTest: its error table and chart are `kvsim validate`'s for the built-in
example, a zipped results folder and a vllm bench result; a bad upload (a zip leaving its folder or
holding a symlink, a file that is not a zip, a JSON that is not a bench result) is one error line and
unpacks nothing."""

import io
import json
import shlex
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvsim.calibrate.validate import median_abs_error
from tests.test_dashboard import ROOT, cli, downloaded_toml_from_state, figures, one_error, open_app, widget

EXAMPLE = ROOT / "benchmarks/results/validate_h100"


def validation_page(at=None):
    return (at or open_app()).switch_page("views/validation.py").run()


def upload(at, name: str, data: bytes):
    return at.file_uploader(key="kvsim.validation.upload").set_value((name, data, "application/octet-stream")).run()


def uploads_page():
    at = validation_page()
    at.radio(key="kvsim.validation.source").set_value("upload a measured run").run()
    assert [i.value for i in at.info] == ["Upload a measured run of the sidebar's scenario."]
    return at


def cli_records(tmp_path: Path, toml: str, measured: Path, *args: str) -> list[dict]:
    out = tmp_path / "errors.json"
    cli(tmp_path, toml, "--measured", str(measured), "--out", str(out), *args, command="validate")
    return json.loads(out.read_text())["records"]


def same(column, expected: list, rel: float = 1e-12) -> bool:
    """A table column holds these values (None: an empty cell)."""
    nan = float("nan")
    return list(column) == pytest.approx([nan if v is None else v for v in expected], rel=rel, abs=0, nan_ok=True)


def assert_shows(at, records: list[dict]) -> None:
    """The table, the chart and the medians hold exactly these records' figures."""
    assert not at.exception and not at.error
    serving = [r for r in records if r["kind"] == "serving"]
    table = at.dataframe[0].value
    assert list(zip(table["policy"], table["figure"], table["unit"])) == [(r["policy"], r["figure"], r["unit"])
                                                                          for r in serving]
    assert same(table["measured"], [r["measured"] for r in serving], rel=0)
    assert same(table["predicted"], [r["predicted"] for r in serving])
    assert same(table["error"], [None if r["error"] is None else r["error"] * 100 for r in serving])
    [chart] = figures(at)
    for trace in chart["data"]:
        mine = [r for r in serving if r["policy"] == trace["name"] and r["error"] is not None]
        assert trace["y"] == [r["figure"] for r in mine]
        assert trace["x"] == pytest.approx([r["error"] * 100 for r in mine], rel=1e-12)
    assert [t["name"] for t in chart["data"]] == list(dict.fromkeys(r["policy"] for r in serving))
    assert at.metric[0].value == f"{median_abs_error(records):.1%}"


def test_built_in_example_is_kvsim_validate(tmp_path):
    at = validation_page()  # the sidebar holds chat: the example is validated against its own scenario file
    assert [t.value for t in at.title] == ["Validation"]
    (tmp_path / "example").mkdir()
    toml = (ROOT / "scenarios/validate_h100.toml").read_text()
    assert_shows(at, cli_records(tmp_path / "example", toml, EXAMPLE))
    assert [i.value for i in at.info][0].startswith("The example was measured for scenarios/validate_h100.toml")
    assert at.caption[0].value.endswith("`python -m kvsim validate scenarios/validate_h100.toml --measured "
                                        "benchmarks/results/validate_h100`")

    at.button(key="kvsim.validation.use_example").click().run()  # into the sidebar, then a setting changed
    assert at.sidebar.selectbox(key="kvsim.shipped").value == "validate_h100" and not at.info
    widget(at, "number_input", "hardware.gpu_memory_utilization").set_value(0.8).run()
    command = at.caption[0].value.split("`")[1]  # run as the page gives it
    assert command == ("python -m kvsim validate scenarios/validate_h100.toml --set hardware.gpu_memory_utilization=0.8 "
                       "--measured benchmarks/results/validate_h100")
    subprocess.run([sys.executable, *shlex.split(command)[1:], "--out", str(tmp_path / "changed.json")], cwd=ROOT,
                   check=True, capture_output=True)
    records = json.loads((tmp_path / "changed.json").read_text())["records"]
    assert next(r for r in records if r["figure"] == "KV blocks")["predicted"] < 28459  # less memory, fewer blocks
    assert_shows(at, records)

    # the same run uploaded as a zipped results folder gives the same table
    at.radio(key="kvsim.validation.source").set_value("upload a measured run").run()
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as zf:
        for f in EXAMPLE.iterdir():
            zf.write(f, f"validate_h100/{f.name}")
    upload(at, "gpu-run.zip", data.getvalue())
    assert_shows(at, records)


def test_vllm_bench_result_is_kvsim_validate(tmp_path):
    bench = {"completed": 500, "num_prompts": 500, "request_rate": 14.0, "output_throughput": 3000.0,
             "median_ttft_ms": 40.0, "p99_ttft_ms": 300.0, "median_itl_ms": 12.0, "p99_itl_ms": 90.0,
             "mean_tpot_ms": 13.0, "median_e2el_ms": 4000.0, "p99_e2el_ms": 15000.0}
    at = uploads_page()
    widget(at, "number_input", "workload.num_requests").set_value(500)
    upload(at, "bench.json", json.dumps(bench).encode())
    at.selectbox(key="kvsim.validation.policy").set_value("paged-fp8").run()
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    records = cli_records(tmp_path, downloaded_toml_from_state(at), tmp_path / "bench.json", "--policy", "paged-fp8")
    assert {r["policy"] for r in records} == {"paged-fp8"}
    assert [r["figure"] for r in records if r["measured"] is not None] == [
        "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT mean", "E2E p50", "E2E p99", "output tok/s"]
    assert_shows(at, records)


def _zip(*entries, compression=zipfile.ZIP_DEFLATED) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", compression=compression) as zf:
        for info, content in entries:
            zf.writestr(info, content)
    return data.getvalue()


def _link(name: str, target: str) -> tuple:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target


SUMMARY = (EXAMPLE / "summary.json").read_text()


@pytest.mark.parametrize("name, data, message", [
    ("evil.zip", _zip(("run/summary.json", SUMMARY), ("../escaped.txt", "x")),
     "evil.zip: '../escaped.txt': a path leaving the archive's folder ('..')"),
    ("abs.zip", _zip(("/tmp/escaped.txt", "x")), "abs.zip: '/tmp/escaped.txt': an absolute path in the archive"),
    ("link.zip", _zip(_link("run/summary.json", "/etc/passwd")), "link.zip: 'run/summary.json': a symbolic link"),
    ("fake.zip", b"PK\x03\x04 not really", "fake.zip: not a zip archive"),
    ("empty.zip", _zip(("run/notes.txt", "x")), "empty.zip: no summary.json in the archive"),
    ("two.zip", _zip(("a/summary.json", SUMMARY), ("b/summary.json", SUMMARY)), "two.zip: more than one summary.json"),
    ("bad.json", b'{"completed": 3}', "bad.json: not a `vllm bench serve --save-result` JSON"),
    ("bad.json", b"[1, 2", "bad.json:1: invalid JSON"),
])
def test_bad_upload_is_one_error_line_and_unpacks_nothing(name, data, message):
    at = uploads_page()
    upload(at, name, data)
    assert one_error(at).startswith(message)
    assert not figures(at)
    folder = Path(at.session_state["kvsim.upload_dir"])
    assert not list(folder.glob("unpacking-*")) and not list(folder.parent.rglob("escaped.txt"))
    if name.endswith(".zip"):
        assert not [p for p in folder.rglob("*") if p.is_file()] or name in ("empty.zip", "two.zip")


def test_size_limits_are_one_error_line(monkeypatch):
    from kvdash import measured

    monkeypatch.setattr(measured, "MAX_UNPACKED_BYTES", 4096)
    monkeypatch.setattr(measured, "MAX_ZIP_BYTES", 2000)
    monkeypatch.setattr(measured, "MAX_ENTRIES", 2)
    at = uploads_page()
    upload(at, "big.zip", _zip(("run/summary.json", SUMMARY[:1500]), ("run/run.log", "x" * 3000)))
    assert one_error(at) == "big.zip: unpacks to more than the dashboard's 4,096 bytes"
    upload(at, "big2.zip", _zip(("run/summary.json", SUMMARY[:3000]), compression=zipfile.ZIP_STORED))
    assert one_error(at).startswith("big2.zip: archive is 3,")
    upload(at, "many.zip", _zip(*((f"run/{i}.txt", "x") for i in range(3))))
    assert one_error(at) == "many.zip: 3 entries, over the dashboard's limit of 2"
    assert not [p for p in Path(at.session_state["kvsim.upload_dir"]).rglob("*") if p.is_file()]
