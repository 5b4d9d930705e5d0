"""Hostile input (issue 9): every class of bad input ends in one line and exit code 2, and costs no data.

Each case of the table writes its inputs into `in/` and runs the CLI from `work/`, which holds an
unrelated folder and an earlier results folder (the default --out, so every failed run is a failed
re-run). Then: exit code 2, exactly one stderr line naming the culprit, no traceback, and nothing
under the test's folder created or changed (the earlier results stay byte for byte). Large inputs
are generated on the fly. Disk full is a file-size limit (RLIMIT_FSIZE) on a child process, and
signals are sent to a child mid-run.
"""

import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.results.writer import ResultsWriter
from kvsim.scenario import limits
from kvsim.scenario.config import scenario_from_dict
from kvsim.scenario.workload import generate_requests

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = """\
{top}
[model]
{model}
[hardware]
{hardware}
[engine]
max_model_len = 4096
{engine}
[[policies]]
name = "paged"
{policy}
[workload]
seed = 3
num_requests = {num_requests}
{arrival}
{lengths}
{workload}
[output]
report_html = false
{output}
{tail}"""
POISSON = 'arrival = { process = "poisson", rate = 20.0 }'
UNIFORM = 'prompt_len = { dist = "uniform", min = 50, max = 400 }\noutput_len = { dist = "uniform", min = 5, max = 40 }'
TRACE = 'arrival = { process = "trace" }'
LLAMA8 = {"hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n"
CSV_HEADER = "arrival_s,prompt_tokens,output_tokens\n0,10,5\n"


def toml(**parts) -> str:
    fill = dict(top='name = "s"', model='name = "Llama-3.1-8B"', hardware="", engine="", policy="",
                num_requests=30, arrival=POISSON, lengths=UNIFORM, workload="", output="", tail="")
    return SCENARIO.format(**{**fill, **parts})


@dataclass
class Box:
    """The test's folder: inputs, the working directory, an unrelated folder and earlier results."""
    root: Path
    inp: Path
    work: Path
    earlier: Path

    def file(self, name: str, content, mode: str = "w") -> Path:
        path = self.inp / name
        with open(path, mode) as f:
            f.write(content)
        return path

    def scenario(self, name: str = "s.toml", **parts) -> Path:
        return self.file(name, toml(**parts))

    def trace(self, fmt: str, name: str, content, mode: str = "w", lengths: str = UNIFORM, num_requests=1) -> Path:
        self.file(name, content, mode)
        return self.scenario(arrival=TRACE, num_requests=num_requests, lengths=lengths,
                             tail=f'[workload.trace]\nformat = "{fmt}"\npath = "{name}"\n')

    def hf(self, config, **parts) -> Path:
        self.file("config.json", config if isinstance(config, str) else json.dumps({**LLAMA8, **config}))
        return self.scenario(model='hf_config = "config.json"', **parts)


@pytest.fixture(scope="module")
def earlier_results(tmp_path_factory) -> Path:
    """One good run's results folder, copied into every case's working directory."""
    folder = tmp_path_factory.mktemp("earlier")
    (folder / "s.toml").write_text(toml())
    assert main([str(folder / "s.toml"), "--out", str(folder / "res"), "--quiet"]) == 0
    return folder / "res"


@pytest.fixture
def box(tmp_path, monkeypatch, earlier_results) -> Box:
    b = Box(tmp_path, tmp_path / "in", tmp_path / "work", tmp_path / "work" / "results" / "earlier")
    b.inp.mkdir()
    (b.work / "unrelated").mkdir(parents=True)
    (b.work / "unrelated" / "notes.txt").write_text("someone else's work")
    shutil.copytree(earlier_results, b.earlier)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(b.work)
    return b


def snapshot(root: Path) -> dict:
    """Every path under root: files with mode, content hash and modification time, folders with mode
    (their entries are paths of their own; a temporary folder made and removed again is no change)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, hashlib.sha1(p.read_bytes()).hexdigest())
            else:
                out[str(p.relative_to(root))] = (st.st_mode,)
    return out


def assert_one_line_error(code: int, err: str, names) -> None:
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvsim: error: ") and "Traceback" not in err
    for name in names:
        assert name in lines[0], (name, lines[0])


def _oserror(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@dataclass
class Case:
    build: Callable[[Box], list]  # writes the inputs, returns the command line (run: --out earlier added)
    names: tuple  # what the error line must name
    patch: Callable = None  # (monkeypatch) -> None: an OS failure injected at a write site


S = "s.toml"
CASES = {
    # 1. output paths
    "name absolute path": Case(lambda b: [b.scenario(top=f'name = "{b.work / "unrelated"}"'), "--out", None],
                               (S, "name: must be a plain file name")),
    "name ../x": Case(lambda b: [b.scenario(top='name = "../x"'), "--out", None], (S, "name:", "'../x'")),
    "name .": Case(lambda b: [b.scenario(top='name = "."'), "--out", None], (S, "name:")),
    "name ..": Case(lambda b: [b.scenario(top='name = ".."'), "--out", None], (S, "name:")),
    "name with NUL": Case(lambda b: [b.scenario(top='name = "a\\u0000b"'), "--out", None], (S, "name:")),
    "name 101 chars": Case(lambda b: [b.scenario(top=f'name = "{"x" * 101}"'), "--out", None], (S, "name:", "100")),
    "--set name=/abs": Case(lambda b: [b.scenario(), "--set", f"name={b.work}"], (S, "name:")),
    "--out .": Case(lambda b: [b.scenario(), "--out", "."], ("holds the current directory",)),
    "--out ..": Case(lambda b: [b.scenario(), "--out", "..", "--force"], ("holds the current directory",)),
    "--out /": Case(lambda b: [b.scenario(), "--out", "/", "--force"], ("root folder",)),
    "--out home --force": Case(lambda b: [b.scenario(), "--out", "~", "--force"], ("your home folder",)),
    "--out unrelated folder": Case(lambda b: [b.scenario(), "--out", "unrelated"],
                                   ("unrelated: folder exists and is not a kvsim results folder", "--force")),
    "--out input folder --force": Case(lambda b: [b.scenario(), "--out", b.inp, "--force"], ("holds input", S)),
    "--out a file": Case(lambda b: [b.scenario(), "--out", "unrelated/notes.txt"], ("not a folder",)),
    "results folder with a stray file": Case(
        lambda b: [b.scenario(), "--out", b.file("../work/results/earlier/mine.txt", "x").parent],
        ("files kvsim did not write (mine.txt)",)),
    # 2. writes fail cleanly (disk full through RLIMIT_FSIZE: test_disk_full_keeps_earlier_results)
    "disk full writing the report": Case(lambda b: [b.scenario(), "--set", "output.report_html=true"],
                                         ("cannot write results to", "earlier: No space left on device"),
                                         lambda mp: mp.setattr("kvsim.results.writer.write_report_html",
                                                               _oserror(errno.ENOSPC))),
    "permission denied": Case(lambda b: [b.scenario()], ("cannot write results to", "Permission denied"),
                              lambda mp: mp.setattr(ResultsWriter, "_fresh_dir", _oserror(errno.EACCES))),
    "read-only file system": Case(lambda b: [b.scenario()], ("cannot write results to", "Read-only file system"),
                                  lambda mp: mp.setattr("kvsim.results.writer.rename_exchange", _oserror(errno.EROFS))),
    # 3. finite and bounded numbers
    "rate inf": Case(lambda b: [b.scenario(arrival='arrival = { process = "poisson", rate = inf }')],
                     (S, "workload.arrival.rate: must be a finite number")),
    "rate nan via --set": Case(lambda b: [b.scenario(), "--set", "workload.arrival.rate=nan"],
                               (S, "workload.arrival.rate: must be a finite number")),
    "int over 64 bits": Case(lambda b: [b.scenario(num_requests="99999999999999999999")],
                             (S, "workload.num_requests: integer out of range")),
    "int over 4300 digits": Case(lambda b: [b.scenario(num_requests="9" * 5000)], (f"{S}:14", "integer too long")),
    "num_requests bound": Case(lambda b: [b.scenario(num_requests=10**9)],
                               (S, "workload.num_requests: must be at most 10,000,000")),
    "max_model_len bound": Case(lambda b: [b.file(S, toml().replace("max_model_len = 4096", "max_model_len = 2**31")
                                                    .replace("2**31", "2147483648"))],
                                (S, "engine.max_model_len: must be at most 16,777,216")),
    "replicas bound": Case(lambda b: [b.scenario(hardware="num_replicas = 100000")],
                           (S, "hardware.num_replicas: must be at most 4,096")),
    "memory bound": Case(lambda b: [b.scenario(hardware="memory_gib = 1e30")], (S, "hardware.memory_gib")),
    "bandwidth lower bound": Case(lambda b: [b.scenario(hardware="hbm_bandwidth_gbps = 1e-300")],
                                  (S, "hardware.hbm_bandwidth_gbps: must be at least 0.01")),
    "cv lower bound": Case(lambda b: [b.scenario(arrival='arrival = { process = "gamma", rate = 2.0, cv = 0.0 }')],
                           (S, "workload.arrival.cv: must be at least 0.01")),
    "rate × duration": Case(lambda b: [b.file(S, toml().replace("num_requests = 30", "duration_s = 1e8"))],
                            (S, "duration_s", "more than 10,000,000")),
    "prefix groups × length": Case(lambda b: [b.scenario(workload="prefix = { num_groups = 65536, prefix_len = 65536 }")],
                                   (S, "workload.prefix: num_groups × prefix_len")),
    "KV blocks bound": Case(lambda b: [b.scenario(hardware="memory_gib = 1000000.0", engine="block_size = 1")],
                            (S, "KV blocks", "134,217,728")),
    "calibration inf": Case(lambda b: [b.file("cal.json", '{"compute_efficiency": 1e400}') and
                                       b.scenario(tail='[backend]\ncalibration = "cal.json"\n')],
                            ("cal.json: compute_efficiency: must be a finite number",)),
    "calibration efficiency bound": Case(lambda b: [b.file("cal.json", '{"memory_efficiency": 1e-300}') and
                                                    b.scenario(tail='[backend]\ncalibration = "cal.json"\n')],
                                         ("cal.json: memory_efficiency: must be in [0.001, 1]",)),
    "hf_config NaN": Case(lambda b: [b.hf(json.dumps({**LLAMA8, "rope_theta": 1}).replace("1}", "NaN}"))],
                          ("config.json:1: invalid JSON: NaN",)),
    "hf_config bound": Case(lambda b: [b.hf({"max_position_embeddings": 10**12})],
                            ("config.json: max_position_embeddings: must be at most 16,777,216",)),
    # 4. model consistency
    "hidden not a multiple of heads": Case(lambda b: [b.hf({"hidden_size": 4097})],
                                           ("config.json: hidden_size 4097 is not a multiple", "head_dim")),
    "kv heads do not divide heads": Case(lambda b: [b.hf({"num_key_value_heads": 7})],
                                         ("config.json: num_key_value_heads: 7 does not divide",)),
    "head_dim 0": Case(lambda b: [b.hf({"head_dim": 0})], ("config.json: head_dim: must be a positive integer",)),
    "layers negative": Case(lambda b: [b.hf({"num_hidden_layers": -2})], ("config.json: num_hidden_layers",)),
    "tp does not divide heads": Case(lambda b: [b.scenario(hardware="tensor_parallel_size = 3")],
                                     (S, "hardware.tensor_parallel_size: 3 does not divide", "32 attention heads")),
    "tp vs kv heads": Case(lambda b: [b.hf({"num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128},
                                           hardware="tensor_parallel_size = 12")],
                           (S, "hardware.tensor_parallel_size: 12 GPUs cannot share", "8 KV heads")),
    # 5. one reader for every file
    "scenario is a device": Case(lambda b: ["/dev/zero"], ("/dev/zero: scenario file is a character device",)),
    "scenario is a folder": Case(lambda b: [b.inp], ("scenario file is a folder",)),
    "scenario over 1 MiB": Case(lambda b: [_sparse(b.inp / S, 2 << 20)], (S, "larger than 1 MiB")),
    "scenario NUL byte": Case(lambda b: [b.file(S, toml().replace("seed = 3", "seed = 3\0"))], (f"{S}:13: NUL byte",)),
    "scenario not UTF-8": Case(lambda b: [b.file(S, toml().encode().replace(b"seed = 3", b"seed = 3 #\xff"), "wb")],
                               (f"{S}:13", "not UTF-8")),
    "scenario nested deep": Case(lambda b: [b.scenario(top='name = "s"\nx = ' + "[" * 50000 + "]" * 50000)],
                                 (S, "nested more than 32 levels")),
    "hf_config nested deep": Case(lambda b: [b.hf('{"a": ' + "[" * 50000 + "]" * 50000 + "}")],
                                  ("config.json: nested more than 32 levels",)),
    "hf_config 4300 digits": Case(lambda b: [b.hf('{"vocab_size": ' + "1" * 5000 + "}")],
                                  ("config.json:1: invalid JSON: integer too long",)),
    "trace is a device": Case(lambda b: [b.file(S, toml(arrival=TRACE, tail='[workload.trace]\nformat = "csv"\n'
                                                                            'path = "/dev/zero"\n'))],
                              ("/dev/zero: trace is a character device",)),
    "azure year 0001": Case(lambda b: [b.trace("azure", "t.csv", AZURE_HEADER + "0001-01-01 00:00:00,10,5\n")],
                            ("t.csv:3: bad timestamp", "0001-01-01")),
    "azure year 9999": Case(lambda b: [b.trace("azure", "t.csv", AZURE_HEADER + "9999-12-31 23:59:59,10,5\n")],
                            ("t.csv:3: bad timestamp", "9999-12-31")),
    "csv arrival 1e308": Case(lambda b: [b.trace("csv", "t.csv", CSV_HEADER + "1e308,10,5\n")],
                              ("t.csv:3: bad timestamp in arrival_s",)),
    "csv NUL byte": Case(lambda b: [b.trace("csv", "t.csv", CSV_HEADER + "1,1\x000,5\n")], ("t.csv:3: NUL byte",)),
    "csv tokens over bound": Case(lambda b: [b.trace("csv", "t.csv", CSV_HEADER + "1,10,4294967296\n")],
                                  ("t.csv:3: output_tokens must be at most 2,147,483,648",)),
    "csv field over limit": Case(lambda b: [b.trace("csv", "t.csv", CSV_HEADER + '1,"' + "1" * 200_000 + '",5\n')],
                                 ("t.csv:3: bad CSV",)),
    "mooncake prompt over bound": Case(
        lambda b: [b.trace("mooncake", "t.jsonl", MOONCAKE_ROW + '{"timestamp": 1, "input_length": 1099511627776, '
                                                                 '"output_length": 5, "hash_ids": [1]}\n')],
        ("t.jsonl:2: input_length must be at most",)),
    "mooncake nested deep": Case(lambda b: [b.trace("mooncake", "t.jsonl", MOONCAKE_ROW + "[" * 50000 + "\n")],
                                 ("t.jsonl:2: bad JSON",)),
    "mooncake timestamp 4300 digits": Case(
        lambda b: [b.trace("mooncake", "t.jsonl", MOONCAKE_ROW + '{"timestamp": ' + "1" * 5000 + "}\n")],
        ("t.jsonl:2: bad JSON: integer too long",)),
    # 6. `kvsim memory` obeys the rules of `run`. By hand: 70B is 131.4 GiB of bf16 weights; an H100 gives
    # 79.6 x 0.9 = 71.7 GiB, so tp 1 cannot hold them and tp 2 (65.7 GiB each) leaves ~4.5 GiB for 4096 tokens
    # of KV (160 KiB a token); an L40S gives 40.5 GiB: tp 2 (65.7) cannot, tp 4 (32.9) can.
    "memory: 70B on one H100": Case(lambda b: ["memory", b.scenario(model='name = "Llama-3.1-70B"')],
                                    (S, "does not fit", "the smallest tensor_parallel_size that fits: 2")),
    "memory: 70B on one L40S": Case(lambda b: ["memory", b.scenario(model='name = "Llama-3.1-70B"',
                                                                     hardware='gpu = "L40S"')],
                                    (S, "L40S", "the smallest tensor_parallel_size that fits: 4")),
    "memory: bad tp": Case(lambda b: ["memory", b.scenario(hardware="tensor_parallel_size = 5")],
                           (S, "hardware.tensor_parallel_size")),
}


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _argv(box: Box, built: list) -> list[str]:
    argv = [str(a) for a in built]
    if argv[0] != "memory" and "--out" not in argv:
        argv += ["--out", str(box.earlier)]
    if argv[-1] == "None":  # "--out None": the scenario's own output.dir/name
        argv = argv[:-2]
    return argv + (["--quiet"] if argv[0] != "memory" else [])


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(box, capsys, monkeypatch, name):
    case = CASES[name]
    argv = _argv(box, case.build(box))
    before = snapshot(box.root)
    if case.patch:
        case.patch(monkeypatch)
    code = main(argv)
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, case.names)
    monkeypatch.undo()
    assert snapshot(box.root) == before


def _as_from_a_terminal() -> None:
    """A command typed at a terminal gets Ctrl-C and hang-ups, even when the tests run in the background
    (`nohup`, or `cmd &` in a script, which ignore SIGHUP and SIGINT and pass that on)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _child(box: Box, argv: list, **kw) -> subprocess.Popen:
    kw.setdefault("preexec_fn", _as_from_a_terminal)
    env = {**os.environ, "HOME": str(box.root / "home"), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "kvsim", *map(str, argv)], cwd=box.work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_disk_full_keeps_earlier_results(box):
    """A file-size limit (what a full disk looks like to a writer) hit while requests.csv streams."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
    argv = [box.scenario(num_requests=2000), "--out", box.earlier, "--quiet"]
    before = snapshot(box.root)
    proc = _child(box, argv, preexec_fn=limit)
    _, err = proc.communicate(timeout=120)
    assert_one_line_error(proc.returncode, err, (f"cannot write results to {box.earlier}: File too large",))
    assert snapshot(box.root) == before


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_mid_run_leaves_nothing(box, sig):
    argv = [box.scenario(num_requests=300_000), "--out", box.earlier, "--quiet"]
    before = snapshot(box.root)
    proc = _child(box, argv)
    deadline = time.monotonic() + 60
    def streaming():  # requests.csv has rows in the temporary folder: mid-run
        csvs = [p / "requests.csv" for p in box.earlier.parent.glob(".earlier.tmp-*")]
        return any(c.exists() and c.stat().st_size > 0 for c in csvs)
    while not streaming():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, sig)
    assert err == f"kvsim: terminated ({sig})\n"
    assert snapshot(box.root) == before


@pytest.mark.parametrize("which", ["scenario", "trace"])
def test_fifo_is_refused_without_blocking(box, which):
    fifo = box.inp / "fifo"
    os.mkfifo(fifo)
    argv = [fifo] if which == "scenario" else [
        box.file(S, toml(arrival=TRACE, tail='[workload.trace]\nformat = "csv"\npath = "fifo"\n'))]
    before = snapshot(box.root)
    proc = _child(box, [*argv, "--out", box.earlier])
    _, err = proc.communicate(timeout=60)
    assert_one_line_error(proc.returncode, err, ("fifo", "is a FIFO, not a regular file"))
    assert snapshot(box.root) == before


def test_a_row_that_can_never_run_is_never_expanded(box, capsys, monkeypatch):
    """A 1M-block Mooncake row (512M tokens, 8 MB of text) under max_model_len 4096: rejected, and its
    block ids never become a content identity, let alone token ids; the rows that fit get theirs."""
    import kvsim.scenario.workload as workload
    big = json.dumps({"timestamp": 5, "input_length": 2**19 * 512, "output_length": 5, "hash_ids": list(range(2**19))})
    rows = MOONCAKE_ROW + big + "\n" + MOONCAKE_ROW.replace('"timestamp": 0', '"timestamp": 9')
    scenario = box.trace("mooncake", "t.jsonl", rows, num_requests=3,
                         lengths='prompt_len = { dist = "trace" }\noutput_len = { dist = "trace" }')
    keyed = []
    real = workload._keyed_tokens
    monkeypatch.setattr(workload, "_keyed_tokens", lambda trace, row, n: keyed.append(n) or real(trace, row, n))
    code = main([str(scenario), "--out", str(box.work / "res"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((box.work / "res" / "summary.json").read_text())
    assert doc["policies"]["paged"]["requests"]["rejected"] == 1
    assert len(keyed) == 2 and max(keyed) < 2**19 * 512


def test_lognormal_lengths_never_overflow():
    """Heavy tails are clipped at MAX_TOKENS (no max given), so no length overflows int64 to a negative
    number, even for parameters the schema would refuse (mean 1e30)."""
    from kvsim.scenario.config import LengthDist
    from kvsim.scenario.workload import draw_lengths
    sc = scenario_from_dict({"model": {"name": "Llama-3.1-8B"}, "policies": [{"name": "p"}], "workload": {
        "num_requests": 2000, "prompt_len": {"dist": "lognormal", "mean": 2.0**31, "sigma": 3.0},
        "output_len": {"dist": "lognormal", "mean": 5, "sigma": 10.0, "min": 3}}})
    reqs = list(generate_requests(sc))
    prompt = np.array([r.prompt_len for r in reqs])
    output = np.array([r.output_len for r in reqs])
    assert prompt.min() >= 1 and prompt.max() == limits.MAX_TOKENS and (prompt == limits.MAX_TOKENS).sum() > 100
    assert output.min() == 3 and output.max() <= limits.MAX_TOKENS
    wild = LengthDist.model_construct(dist="lognormal", mean=1e30, sigma=10.0, min=None, max=None)
    lengths = draw_lengths(wild, np.random.default_rng(0), 1000, None, None, "prompt_len")
    assert min(lengths) >= 1 and max(lengths) == limits.MAX_TOKENS


def test_abort_never_raises(tmp_path):
    writer = ResultsWriter(tmp_path / "res")
    writer.requests_file.write("x" * 100)

    class Failing:
        closed = False

        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")
    writer.requests_file.file.close()
    writer.requests_file.file = Failing()
    writer.abort()
    writer.abort()  # twice is fine too
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_an_unrelated_folder_and_empty_folders_are_used(box, capsys):
    scenario = box.scenario()
    assert main([str(scenario), "--out", "unrelated", "--quiet", "--force"]) == 0
    assert not (box.work / "unrelated" / "notes.txt").exists()
    assert (box.work / "unrelated" / ".kvsim-results.json").is_file()
    (box.work / "empty").mkdir()
    assert main([str(scenario), "--out", "empty", "--quiet"]) == 0
    assert (box.work / "empty" / "summary.json").read_bytes() == (box.work / "unrelated" / "summary.json").read_bytes()
    assert main([str(scenario), "--out", "empty", "--quiet"]) == 0  # a re-run replaces its own folder
    assert capsys.readouterr().err == ""


def test_output_dir_is_relative_to_the_working_directory(box, capsys):
    scenario = box.scenario(top='name = "chat"', output='dir = "runs"')
    assert main([str(scenario), "--quiet"]) == 0, capsys.readouterr().err
    assert (box.work / "runs" / "chat" / "summary.json").is_file()
    assert not (box.inp / "runs").exists()


def test_every_schema_field_is_described():
    from kvsim.scenario import autoscaling, config, load_curve
    sections = {c for module in (config, load_curve, autoscaling) for c in vars(module).values()
                if isinstance(c, type) and issubclass(c, config._Section) and c is not config._Section}
    fields = [(c.__name__, name, f.description) for c in sections for name, f in c.model_fields.items()]
    # 14: [cost]; 15: [workload.trace.columns]; 16-17: think_time_s, [workload.sessions]; 20: [disaggregation];
    # 21-22: [speculative], [energy]; 23-35: [workload.arrival.curve] (and its bursts), [autoscaling] and its
    # eleven tables
    assert len(sections) == 35 and len(fields) > 60
    assert [(c, n) for c, n, d in fields if not d or len(d) < 15] == []
    schema = json.loads(subprocess.run([sys.executable, "-m", "kvsim", "schema"], cwd=ROOT, capture_output=True,
                                       text=True, check=True).stdout)
    gpu = schema["$defs"]["HardwareConfig"]["properties"]["gpu"]
    assert gpu["enum"] == ["A100-80GB", "H100-SXM", "H200", "L40S", "B200", "MI300X"] and gpu["description"]


def test_scenario_reference_is_current():
    from kvsim.scenario.reference import schema_markdown
    assert (ROOT / "docs" / "scenario-reference.md").read_text() == schema_markdown()


def test_bad_value_errors_name_key_and_bound():
    with pytest.raises(KvsimError, match=r"^<scenario>: workload.prompt_len.value: must be at most 2,147,483,648, "
                                         r"got 2147483649$"):
        scenario_from_dict({"model": {"name": "Llama-3.1-8B"}, "policies": [{"name": "p"}],
                            "workload": {"num_requests": 1, "prompt_len": {"value": 2**31 + 1}}})


def test_trace_row_cap(box, monkeypatch):
    import kvsim.scenario.trace_rows as trace_rows
    import kvsim.scenario.traces as traces
    monkeypatch.setattr(trace_rows, "MAX_REQUESTS", 3)
    path = box.file("t.csv", CSV_HEADER + "1,10,5\n2,10,5\n3,10,5\n")
    with pytest.raises(KvsimError, match=r"t\.csv:5: trace has more than 3 requests$"):
        traces.load_csv(path)


def test_results_folder_from_before_markers_is_replaced(box, capsys):
    (box.earlier / ".kvsim-results.json").unlink()  # as kvsim wrote folders before markers
    assert main([str(box.scenario()), "--out", str(box.earlier), "--quiet"]) == 0, capsys.readouterr().err
    assert (box.earlier / ".kvsim-results.json").is_file()
    (box.earlier / ".kvsim-results.json").unlink()
    (box.earlier / "notes.txt").write_text("mine")
    assert main([str(box.scenario()), "--out", str(box.earlier), "--quiet"]) == 2
    assert "not a kvsim results folder" in capsys.readouterr().err
