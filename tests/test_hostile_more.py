"""Hostile input, second sweep: the command-line arguments, planning and sweep sizes, measured results and
model configs that still ended in a traceback, a hang or a silent wrong answer, and the library API's
bad arguments (each a `KvsimError`, never a random exception).

The command-line cases run in-process in test_hostile's box (an unrelated folder and an earlier results
folder beside the inputs): exit code 2, one stderr line naming the culprit, nothing changed.
"""

import errno
import json
import tracemalloc

import pytest

import kvsim
from kvsim.calibrate.validate import step_records
from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.scenario.files import check_values
from kvsim.scenario.publish import write_text_atomic
from test_hostile import (S, _oserror, assert_one_line_error, box, earlier_results, snapshot,  # noqa: F401 (fixtures)
                          toml)

GRID = ["--set", "workload.seed=" + ",".join(map(str, range(101))),
        "--set", "engine.max_num_seqs=" + ",".join(map(str, range(1, 101)))]  # 10,100 points

ALL_REDUCE = "time_stats.all_reduce.median,num_workers,size\n0.03,2,2048\n"


def calibrate(b, rows: str) -> list:
    """`kvsim calibrate` of a Vidur all_reduce.csv whose last rows are `rows`."""
    return ["calibrate", b.file("all_reduce.csv", ALL_REDUCE + rows), "--gpu", "H100-SXM", "-o", "cal.json"]


# name: (build(box) -> argv, what the error line must name[, patch(monkeypatch)])
CASES = {
    "[cost] price of an unknown GPU": (lambda b: [b.scenario(tail='[cost]\ngpu_hour_usd = { "H100" = 2.0 }\n')],
                                       (S, "cost.gpu_hour_usd.H100: unknown GPU 'H100' (presets:")),
    "block_size = true": (lambda b: [b.scenario(engine="block_size = true")],
                          (S, "engine.block_size: must be 1, 8, 16, 32, 64 or 128")),
    # Mixture-of-experts and latent attention are read now: a malformed one is refused, naming the key
    "hf_config mixture of experts, top-k above the experts": (
        lambda b: [b.hf({"num_local_experts": 8, "num_experts_per_tok": 9})],
        ("config.json: num_experts_per_tok: 9 is more than the 8 experts (num_local_experts)",)),
    "hf_config latent attention without its rope size": (lambda b: [b.hf({"kv_lora_rank": 512})],
                                                         ("config.json: missing key 'qk_rope_head_dim'",)),
    "hf_config linear attention (Qwen3-Next)": (
        lambda b: [b.hf({"linear_num_value_heads": 32, "full_attention_interval": 4})],
        ("config.json: linear_num_value_heads: linear-attention layers (Qwen3-Next's Gated DeltaNet) are not "
         "supported",)),
    "hf_config sliding window under swap preemption": (  # sliding windows simulate (the hybrid allocator); swap not
        lambda b: [b.hf({"sliding_window": 1024}, engine='preemption_mode = "swap"')],  # max_model_len is 4096
        ("engine.preemption_mode: swap is not simulated for", "sliding-window KV cache groups (vLLM V1 has no swap)"
         ": use recompute")),
    "sweep grid of 10,100 points": (lambda b: ["sweep", b.scenario(), *GRID],
                                    ("--set: the grid has more than 10,000 points (10,100)",)),
    "sweep points file of 10,001 rows": (lambda b: ["sweep", b.scenario(), "--from",
                                                    b.file("p.csv", "workload.seed\n" + "1\n" * 10_001)],
                                         ("p.csv has more than 10,000 points",)),
    "sweep points field over the CSV limit": (lambda b: ["sweep", b.scenario(), "--from",
                                                         b.file("p.csv", "workload.seed\n" + "1" * 200_000 + "\n")],
                                              ("p.csv: bad CSV: field larger than field limit",)),
    "plan --seeds 10^9": (lambda b: ["plan", b.scenario(), "--seeds", "1000000000"],
                          ("seeds must be an integer in [1, 1,000]",)),
    "plan --resolution 1e-300": (lambda b: ["plan", b.scenario(), "--resolution", "1e-300"],
                                 ("resolution must be in [0.0001, 0.5), got 1e-300",)),
    "plan --workers 100000": (lambda b: ["plan", b.scenario(), "--workers", "100000"],
                              ("--workers must be an integer in [1, 256], got 100000",)),
    "validate: a policy's summary not an object": (
        lambda b: ["validate", b.scenario(), "--measured", b.file("m.json", '{"policies": {"paged": 5}}')],
        ("m.json: policies.paged: expected an object",)),
    "profile --device bogus": (lambda b: ["profile", "--model", "Qwen3-0.6B", "--device", "bogus", "-o", "p.csv"],
                               ("--device: not a torch device: 'bogus'",)),
    "calibrate: a time of inf": (lambda b: calibrate(b, "inf,2,4096\n"),
                                 ("all_reduce.csv:3: time_stats.all_reduce.median: must be at most 9e+15, got 'inf'",)),
    "calibrate: a short row": (lambda b: calibrate(b, "0.03,2\n"),
                               ("all_reduce.csv:3: fewer cells than the header's 3 columns",)),
    "calibrate: a long row": (lambda b: calibrate(b, "0.03,2,4096,7\n"),
                              ("all_reduce.csv:3: more cells than the header's 3 columns",)),
    "calibrate: zero workers": (lambda b: calibrate(b, "0.03,0,4096\n"),
                                ("all_reduce.csv:3: num_workers: must be a whole number >= 1, got '0'",)),
    "calibrate --serving: a negative figure": (
        lambda b: ["calibrate", "--serving", b.scenario(), b.file("b.json", json.dumps(
            {"completed": 3, "output_throughput": 10.0, "median_ttft_ms": -5})), "-o", "cal.json"],
        ("b.json: median_ttft_ms: must be a non-negative number, got -5",)),
    "validate --out on a full disk": (lambda b: ["validate", b.scenario(), "--measured", b.earlier, "--out", "e.json"],
                                      ("cannot write the error table to e.json: No space left on device",),
                                      lambda mp: mp.setattr("kvsim.scenario.publish.rename_noreplace", _oserror(errno.ENOSPC))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input_more(box, capsys, monkeypatch, name):
    build, names, *patch = CASES[name]
    argv = [str(a) for a in build(box)]
    if argv[0].endswith(".toml"):
        argv += ["--out", str(box.earlier), "--quiet"]
    before = snapshot(box.root)
    for p in patch:
        p(monkeypatch)
    code = main(argv)
    assert_one_line_error(code, capsys.readouterr().err, names)
    monkeypatch.undo()
    assert snapshot(box.root) == before


def test_single_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A calibration or error table: a failed write leaves the earlier file as it was and no temporary; a
    file kvsim may not replace is never replaced."""
    target = tmp_path / "cal.json"
    target.write_text("earlier")
    monkeypatch.setattr("kvsim.scenario.publish.rename_exchange", _oserror(errno.EROFS))
    with pytest.raises(KvsimError, match=r"^cannot write calibration to .*cal\.json: Read-only file system$"):
        write_text_atomic(target, "new", "calibration", may_replace=lambda p: True)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"] and target.read_text() == "earlier"
    with pytest.raises(KvsimError, match=r"cal\.json: already exists; kvsim does not overwrite a file it did not"):
        write_text_atomic(target, "new", "calibration")
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"] and target.read_text() == "earlier"
    write_text_atomic(target, "new", "calibration", may_replace=lambda p: True)
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"] and target.read_text() == "new"


@pytest.mark.parametrize("argv, names", [
    ([], ("kvsim: error: the following arguments are required: COMMAND",)),
    (["schema", "x"], ("kvsim: error: unrecognized arguments: x",)),
    (["plan", "s.toml", "--seeds", "0"], ("kvsim plan: error: argument --seeds: must be positive, got 0",)),
    (["profile"], ("kvsim profile: error: the following arguments are required: --model, -o/--out",)),
    (["dashboard", "--server.port", "99999"], ("kvsim dashboard: error: argument --server.port: must be a TCP port",)),
    (["dashboard", "--server.headless", "x"], ("argument --server.headless: invalid choice: 'x'",)),
])
def test_argument_errors_are_one_line(capsys, argv, names):
    """argparse's own errors: one line and exit code 2, no usage block."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert all(n in err for n in names) and err.rstrip().endswith("--help)"), err


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / S
    path.write_text(toml())
    return kvsim.load_scenario(path)


API_CASES = {
    "load_scenario(None)": (lambda sc: kvsim.load_scenario(None), "scenario file: expected a file path"),
    "load_scenario(overrides=a string)": (lambda sc: kvsim.load_scenario(sc.source, "engine.block_size=8"),
                                          "--set: expected a list of 'dotted.key=value' strings"),
    "load_scenario(overrides=[1])": (lambda sc: kvsim.load_scenario(sc.source, [1]),
                                     "--set: expected a 'dotted.key=value' string, got int"),
    "run(out_dir=5)": (lambda sc: kvsim.run(sc, out_dir=5), "out_dir: expected a file path"),
    "run(policies='paged')": (lambda sc: kvsim.run(sc, policies="paged"), "--policy: expected a list of policy names"),
    "run(policies=['nope'])": (lambda sc: kvsim.run(sc, policies=["nope"]), "--policy: no policy named nope"),
    "plan(policies=['nope'])": (lambda sc: kvsim.plan(sc, policies=["nope"]), "--policy: no policy named nope"),
    "memory(seq_lens=[0])": (lambda sc: kvsim.memory(sc, seq_lens=[0]), r"seq_lens: each must be an integer in \[1"),
    "memory(seq_lens='abc')": (lambda sc: kvsim.memory(sc, seq_lens="abc"), "expected lists, got a string"),
    "plan(seeds='3')": (lambda sc: kvsim.plan(sc, seeds="3"), "seeds must be an integer"),
    "plan(resolution=None)": (lambda sc: kvsim.plan(sc, resolution=None), "resolution must be in"),
    "plan(workers='2')": (lambda sc: kvsim.plan(sc, workers="2"), "--workers must be an integer"),
    "deploy(target_rate='x')": (lambda sc: kvsim.deploy(sc, "x"), "--target-rate must be positive, got 'x'"),
    "deploy(tensor_parallel=None)": (lambda sc: kvsim.deploy(sc, 1.0, tensor_parallel=None), "--tp: expected a list"),
    "deploy(tensor_parallel=(0,))": (lambda sc: kvsim.deploy(sc, 1.0, tensor_parallel=(0,)),
                                     r"--tp must be an integer in \[1, 1,024\]"),
    "deploy(top=0)": (lambda sc: kvsim.deploy(sc, 1.0, top=0), "--top must be an integer"),
    "deploy(max_replicas=-5)": (lambda sc: kvsim.deploy(sc, 1.0, max_replicas=-5), "--max-replicas must be an integer"),
    "sweep(points=None)": (lambda sc: kvsim.sweep(sc, None), "sweep: points must be a"),
    "sweep({key: 3})": (lambda sc: kvsim.sweep(sc, {"workload.seed": 3}), "a grid maps each dotted key to a list"),
    "sweep([[1]])": (lambda sc: kvsim.sweep(sc, [[1]]), "--set: expected a 'dotted.key=value' string"),
    "sweep(10,100-point grid)": (lambda sc: kvsim.sweep(sc, {"workload.seed": list(range(101)),
                                                            "engine.max_num_seqs": list(range(1, 101))}),
                                 r"more than 10,000 points \(10,100\)"),
    "validate(measured=None)": (lambda sc: kvsim.validate(sc, None), "measured results: expected a file path"),
}


@pytest.mark.parametrize("name", sorted(API_CASES))
def test_library_api_bad_arguments(scenario, name):
    call, match = API_CASES[name]
    with pytest.raises(KvsimError, match=match):
        call(scenario)


def test_step_records_skip_figures_that_are_not_numbers():
    summary = {"backend": {"step_times": {"decode": {"predicted_s": 1.0, "measured_s": "x", "steps": None},
                                          "prefill": [1], "mixed": {"predicted_s": "y", "measured_s": 2.0}}}}
    assert step_records("p", summary) == [{"policy": "p", "kind": "step", "figure": "decode steps (None)", "unit": "s",
                                           "measured": None, "predicted": 1.0, "error": None}]
    assert step_records("p", {"backend": 5}) == []


def test_check_values_walks_a_huge_array_in_place():
    """200,000 numbers are checked with no per-element allocation (it was ~160 B each: 4 GB for a 60 MB TOML)."""
    data = {"x": [1] * 200_000 + [2.5] * 100, "y": [[{"z": [1]}]] * 1000}
    tracemalloc.start()
    check_values(data, "s")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 10, peak
    data["y"][999] = [{"z": [float("inf")]}]
    with pytest.raises(KvsimError, match=r"^s: y\[999\]\[0\]\.z\[0\]: must be a finite number, got inf$"):
        check_values(data, "s")
    with pytest.raises(KvsimError, match="nested more than 32 levels"):
        check_values(json.loads("[" * 33 + "]" * 33), "s")
    check_values(json.loads("[" * 32 + "]" * 32), "s")  # 32 levels are fine


def test_a_fit_stays_inside_what_a_calibration_file_may_hold():
    """The fitter's bounds are the reader's (a serving fit ran gemm_pad_tokens to 5e7, then could not read
    its own temporary calibration back: 'gemm_pad_tokens: must be in [0, 1e+06]')."""
    from kvsim.calibrate.fit import _bounds
    from kvsim.perf.calibration import COEFFICIENTS, coefficient_bounds
    lo, hi = _bounds(list(COEFFICIENTS))
    for name, a, b in zip(COEFFICIENTS, lo, hi):
        low, high = coefficient_bounds(name)
        assert low == a and b <= high < float("inf"), name
