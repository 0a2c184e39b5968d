"""``python -m benchmarks all`` (benchmarks/all.py), on the CPU: the plan covers every GPU results
file or says why not, each part fits its ten minutes by the estimates, every entry's arguments are
its runner's, and the dry run, the stale listing and the running machinery work without a GPU."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from benchmarks import all as bench_all
from benchmarks.all import PART_SECONDS, PARTS, PLAN, RETIRED, Entry, card_slug, gpu_files, owner, same_commit, stale
from minisgl.testing.checkpoints import SHARED_CACHE_ENV

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def test_every_gpu_results_file_is_covered_or_retired() -> None:
    files = gpu_files(RESULTS)
    assert files, "no GPU results files found"
    for f in files:
        entry = owner(f)
        assert (entry is not None) != (f.name in RETIRED), (
            f"{f.name}: {'both covered by ' + entry.name + ' and retired' if entry else 'neither covered nor retired'}")
        if entry is not None:
            assert f.benchmark == entry.kind, f"{f.name} is a {f.benchmark!r} file, covered by {entry.name} ({entry.kind!r})"


def test_covered_and_retired_names_are_real_gpu_files() -> None:
    names = {f.name for f in gpu_files(RESULTS)}
    covers = [name for e in PLAN for name in e.covers]
    assert len(covers) == len(set(covers)), "a file covered by two entries"
    for name in [*covers, *RETIRED]:
        assert name in names, f"{name} is not a GPU results file in benchmarks/results"
    assert all(reason.strip() for reason in RETIRED.values())


def test_plan_is_well_formed() -> None:
    assert len({e.name for e in PLAN}) == len(PLAN)
    assert len({e.out for e in PLAN}) == len(PLAN)
    for e in PLAN:
        assert e.part in PARTS and e.gpus >= 1 and e.estimate_s > 0 and e.timeout_s == 2 * e.estimate_s
        assert e.out.count("<card>") == 1 and e.out.endswith(".json") and "/" not in e.out, e.out
        assert e.basis, f"{e.name}: the estimate's basis"
        assert "--out" not in e.argv, f"{e.name}: the runner adds --out"
        assert e.runner in importlib.import_module("benchmarks.__main__").RUNNERS


@pytest.mark.parametrize("part", PARTS)
def test_each_part_fits_ten_minutes_by_the_estimates(part: int) -> None:
    entries = [e for e in PLAN if e.part == part]
    assert entries
    assert sum(e.estimate_s for e in entries) <= PART_SECONDS  # two-GPU entries included


class _Parsed(Exception):
    pass


def _parse_with_runner(entry: Entry, out: str) -> tuple[argparse.Namespace, set[str]]:
    """Hand ``entry``'s arguments to its runner's own ``main`` and stop at its ``parse_args``:
    the namespace it parsed, and the option strings its parser knows."""
    module = importlib.import_module(f"benchmarks.{entry.runner}")
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace), set(self._option_string_actions))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop):
        try:
            module.main([*entry.argv, "--out", out])
        except _Parsed as parsed:
            return parsed.args
        except SystemExit as exc:
            pytest.fail(f"{entry.name}: python -m benchmarks {entry.runner} rejects {list(entry.argv)} ({exc})")
    pytest.fail(f"{entry.name}: benchmarks.{entry.runner}.main never parsed its arguments")


@pytest.mark.parametrize("entry", PLAN, ids=lambda e: e.name)
def test_entry_arguments_parse_with_the_runners_parser(entry: Entry) -> None:
    out = f"benchmarks/results/{entry.file('h200')}"
    args, options = _parse_with_runner(entry, out)
    assert args.out == out
    for token in entry.argv:  # whole option names, not prefixes that argparse would also take
        if token.startswith("--"):
            assert token.split("=")[0] in options, f"{entry.name}: {token} is not an option of {entry.runner}"


def test_card_slug() -> None:
    assert card_slug("NVIDIA H200") == "h200"
    assert card_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert card_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert card_slug("NVIDIA GeForce RTX 4090") == "rtx-4090"
    assert card_slug("Tesla T4") == "t4"


def test_same_commit() -> None:
    assert same_commit("de0f6b5+", "de0f6b5")
    assert same_commit("de0f6b5-dirty", "de0f6b5a1b2c")
    assert not same_commit("de0f6b5", "c9da269")
    assert not same_commit("unknown", "unknown")


def test_dry_run_prints_every_part(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_all.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for e in PLAN:
        assert e.name in out
    assert all(f"part {part}:" in out for part in PARTS) and f"part {max(PARTS) + 1}:" not in out


def test_dry_run_through_python_m_benchmarks() -> None:
    listing = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=REPO, capture_output=True, text=True)
    assert listing.returncode == 0 and "\n  all " in listing.stdout
    run = subprocess.run([sys.executable, "-m", "benchmarks", "all", "--dry-run", "--part", "1", "--card", "h200"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "--out benchmarks/results/graphs_h200.json" in run.stdout
    assert "part 2:" not in run.stdout


def test_only_names_entries_of_the_part() -> None:
    assert [e.name for e in bench_all.plan(2, ["tp", "moe-parallel"])] == ["tp", "moe-parallel"]
    assert [e.name for e in bench_all.plan(2, ["moe", "kernels"])] == ["kernels", "moe"]  # in the plan's order
    with pytest.raises(SystemExit, match="not in part 1"):
        bench_all.plan(1, ["tp"])
    with pytest.raises(SystemExit, match="unknown"):
        bench_all.plan(1, ["no-such-entry"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_a_real_run_refuses_without_cuda() -> None:
    with pytest.raises(SystemExit, match="no CUDA GPU"):
        bench_all.main(["--part", "1"])


def test_stale_listing(capsys: pytest.CaptureFixture[str]) -> None:
    rows, newest, current = stale(RESULTS)
    listed = {r.file.name for r in rows}
    for f in gpu_files(RESULTS):
        if bench_all.latest_entry(f) is None:  # an old name: always superseded
            assert f.name in listed
        elif not same_commit(f.commit, newest[f.card].commit):  # behind its own card's newest
            assert f.name in listed
    assert {f.name for f in newest.values()} <= {f.name for f in current}
    assert bench_all.main(["--stale"]) == 0
    out = capsys.readouterr().out
    assert "superseded by" in out and "graphs_gpu.json" in out


def _write_gpu_file(path: Path, benchmark: str, commit: str, date: str, gpu: str = "NVIDIA H200") -> None:
    path.write_text(json.dumps({"benchmark": benchmark, "date": date, "commit": commit,
                                "hardware": {"gpu": gpu, "gpu_count": 1}, "config": {}, "results": {}}))


def test_stale_names_what_supersedes_each_file(tmp_path: Path) -> None:
    _write_gpu_file(tmp_path / "graphs_gpu.json", "graphs", "aaaaaaa", "2026-11-21T10:00:00+00:00")
    _write_gpu_file(tmp_path / "radix_qwen3-0.6b_h100.json", "radix", "aaaaaaa", "2026-11-22T10:00:00+00:00",
                    gpu="NVIDIA H100 80GB HBM3")
    _write_gpu_file(tmp_path / "graphs_h100.json", "graphs", "ddddddd", "2026-11-24T10:00:00+00:00",
                    gpu="NVIDIA H100 80GB HBM3")
    _write_gpu_file(tmp_path / "graphs_h200.json", "graphs", "bbbbbbb", "2026-11-29T10:00:00+00:00")
    _write_gpu_file(tmp_path / "tp_h200.json", "tp", "bbbbbbb", "2026-11-29T11:00:00+00:00")
    _write_gpu_file(tmp_path / "tp_gpu_h100.json", "tp", "aaaaaaa", "2026-11-22T11:00:00+00:00", gpu="NVIDIA H100")
    _write_gpu_file(tmp_path / "guard_strided_qkv_h100.json", "guard", "ccccccc", "2026-11-23", gpu="NVIDIA H100")
    (tmp_path / "host_cpu.json").write_text(json.dumps({"benchmark": "host", "hardware": {"cpu": "x"}, "results": {}}))
    (tmp_path / "all_h200_part1.json").write_text(json.dumps(
        {"benchmark": "all", "commit": "bbbbbbb", "hardware": {"gpu": "NVIDIA H200"}, "results": {}}))
    rows, newest, current = stale(tmp_path)
    assert {card: f.name for card, f in newest.items()} == {"h200": "tp_h200.json", "h100": "graphs_h100.json"}
    assert [f.name for f in current] == ["graphs_h100.json", "graphs_h200.json", "tp_h200.json"]
    by = {r.file.name: (r.why, r.superseded_by) for r in rows}
    assert by["graphs_gpu.json"] == ("naming", "graphs_h200.json")
    assert by["radix_qwen3-0.6b_h100.json"][0] == "commit"  # the plan's naming, behind the H100's newest commit
    assert "--only radix" in by["radix_qwen3-0.6b_h100.json"][1]
    # an H100 file is superseded by an H100 run, never by the H200's file of the same entry
    assert by["tp_gpu_h100.json"] == ("naming", "tp_h100.json at the h100's newest commit "
                                                "(python -m benchmarks all --part 2 --only tp)")
    assert by["guard_strided_qkv_h100.json"][1].startswith("nothing: retired")
    assert set(by) == {"graphs_gpu.json", "radix_qwen3-0.6b_h100.json", "tp_gpu_h100.json", "guard_strided_qkv_h100.json"}


def test_a_part_runs_skips_and_stops_its_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running machinery with stand-in commands: one writes its file, one fails, one outlives
    twice its estimate, one needs two GPUs on a one-GPU machine; the summary records each."""
    scripts = {
        "writes": "import sys; open(sys.argv[1], 'w').write('{}'); print('done')",
        "fails": "import sys; print('broken'); sys.exit(3)",
        "sleeps": "import time; time.sleep(60)",
        "forgets": "print('no file')",
    }
    entries = [Entry(name, "offline", (), f"{name}_<card>.json", "offline", 1, 1, "test") for name in scripts]
    entries.append(Entry("two-gpus", "tp", (), "two_<card>.json", "tp", 1, 1, "test", gpus=2))
    monkeypatch.setattr(bench_all, "entry_command",
                        lambda e, out: [sys.executable, "-c", scripts.get(e.name, "pass"), out])
    result = bench_all.run_entries(entries, part=1, card="testcard", gpus=1, results_dir=tmp_path)
    status = {r["name"]: r["status"] for r in result["entries"]}
    assert status == {"writes": "ok", "fails": "failed", "sleeps": "timeout", "forgets": "failed", "two-gpus": "skipped"}
    summary = json.loads((tmp_path / "all_testcard_part1.json").read_text())
    assert summary["benchmark"] == "all" and summary["commit"] and "hardware" in summary
    rows = {r["name"]: r for r in summary["results"]["entries"]}
    assert summary["results"]["finished"] is True
    assert summary["results"]["counts"] == {"ok": 1, "failed": 2, "skipped": 1, "timeout": 1}
    assert rows["sleeps"]["seconds"] < 30 and "stopped after" in rows["sleeps"]["reason"]
    assert rows["fails"]["returncode"] == 3 and "broken" in rows["fails"]["tail"]
    assert "was not written" in rows["forgets"]["reason"]
    assert rows["two-gpus"]["reason"] == "needs 2 GPUs, this machine has 1"
    assert rows["writes"]["file"] == "writes_testcard.json" and (tmp_path / "writes_testcard.json").is_file()
    assert all(set(r) >= {"command", "file", "status", "seconds"} for r in rows.values())


def test_memory_held_before_an_entry_is_read_and_warned_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process left by an earlier run (two H200s: one held most of GPU 0, and the next entries
    ran out of memory): the summary says so at the entry, from ``nvidia-smi``'s reading."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '0, 113746, 143771'\necho '1, 1, 143771'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    assert bench_all.gpu_memory_in_use() == [{"gpu": 0, "used_mib": 113746, "total_mib": 143771},
                                             {"gpu": 1, "used_mib": 1, "total_mib": 143771}]
    entries = [Entry("writes", "offline", (), "w_<card>.json", "offline", 1, 5, "test")]
    monkeypatch.setattr(bench_all, "entry_command", lambda e, out: [sys.executable, "-c", "pass", out])
    row = bench_all.run_entries(entries, part=1, card="testcard", gpus=1, results_dir=tmp_path)["entries"][0]
    assert row["warning"] == "before this entry, GPU 0 had 113,746 of 143,771 MiB in use (a process left by an earlier run?)"
    assert row["gpu_memory_before"][1]["used_mib"] == 1
    assert bench_all.busy_gpus([{"gpu": 0, "used_mib": 500, "total_mib": 143771}]) is None  # a CUDA context's worth
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert bench_all.gpu_memory_in_use() is None


def test_deadline_skips_what_no_longer_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [Entry("first", "offline", (), "a_<card>.json", "offline", 1, 1, "test"),
               Entry("second", "offline", (), "b_<card>.json", "offline", 1, 5, "test")]
    monkeypatch.setattr(bench_all, "entry_command",
                        lambda e, out: [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('{}')", out])
    result = bench_all.run_entries(entries, part=2, card="testcard", gpus=1, results_dir=tmp_path, deadline_s=4)
    rows = {r["name"]: r for r in result["entries"]}
    assert rows["first"]["status"] == "ok"
    assert rows["second"]["status"] == "skipped" and "--deadline" in rows["second"]["reason"]


def test_only_merges_into_the_summary_of_the_same_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part cut short by ``--deadline``, then ``--only`` the skipped entries: one summary with
    every entry, the rerun ones replaced; a summary of another commit is not merged."""
    first, second = PLAN[0].name, PLAN[1].name
    entries = [e for e in PLAN if e.name in (first, second)]
    monkeypatch.setattr(bench_all, "entry_command",
                        lambda e, out: [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('{}')", out])
    monkeypatch.setenv("MINISGL_COMMIT", "aaaaaaa")
    bench_all.run_entries(entries, part=PLAN[0].part, card="testcard", gpus=1, results_dir=tmp_path, deadline_s=0.0)
    summary = tmp_path / f"all_testcard_part{PLAN[0].part}.json"
    skipped = json.loads(summary.read_text())["results"]["entries"]
    assert [r["status"] for r in skipped] == ["skipped", "skipped"]
    bench_all.run_entries(entries[1:], part=PLAN[0].part, card="testcard", gpus=1, results_dir=tmp_path,
                          only=[second])
    merged = json.loads(summary.read_text())
    rows = merged["results"]["entries"]
    assert [(r["name"], r["status"]) for r in rows] == [(first, "skipped"), (second, "ok")]
    assert rows[0]["run"] == merged["config"]["earlier_run"]["date"] and "run" not in rows[1]
    assert merged["results"]["counts"]["ok"] == 1 and merged["results"]["counts"]["skipped"] == 1
    monkeypatch.setenv("MINISGL_COMMIT", "bbbbbbb")
    bench_all.run_entries(entries[1:], part=PLAN[0].part, card="testcard", gpus=1, results_dir=tmp_path,
                          only=[second])
    assert [r["name"] for r in json.loads(summary.read_text())["results"]["entries"]] == [second]


def test_a_run_narrowed_to_some_gpus_reads_and_records_only_theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\nfor a in "$@"; do case $a in --id=*) echo "${a#--id=}, 7, 100"; exit 0;; esac; done\n'
                   "echo '0, 1, 100'\necho '1, 1, 100'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert bench_all.gpu_memory_in_use() == [{"gpu": 1, "used_mib": 7, "total_mib": 100}]
    entries = [Entry("writes", "offline", (), "w_<card>.json", "offline", 2, 5, "test")]
    monkeypatch.setattr(bench_all, "entry_command", lambda e, out: [sys.executable, "-c", "pass", out])
    bench_all.run_entries(entries, part=2, card="testcard", gpus=1, results_dir=tmp_path)
    config = json.loads((tmp_path / "all_testcard_part2.json").read_text())["config"]
    assert config["cuda_visible_devices"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert len(bench_all.gpu_memory_in_use()) == 2


def test_entries_share_a_checkpoint_folder_and_log_with_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The part's entries see one ``MINISGL_TINY_CHECKPOINTS`` folder (a tiny checkpoint or
    tokenizer is built once per part, not once per process), gone after the part; with a log
    folder each entry's output lands in ``NAME.log``, every line after its seconds."""
    monkeypatch.delenv(SHARED_CACHE_ENV, raising=False)
    script = ("import os, sys; print('cache', os.environ['MINISGL_TINY_CHECKPOINTS']); "
              "open(sys.argv[1], 'w').write('{}')")
    entries = [Entry(name, "offline", (), f"{name}_<card>.json", "offline", 1, 30, "test") for name in ("a", "b")]
    monkeypatch.setattr(bench_all, "entry_command", lambda e, out: [sys.executable, "-c", script, out])
    bench_all.run_entries(entries, part=1, card="testcard", gpus=1, results_dir=tmp_path, log_dir=tmp_path / "logs")
    logs = [(tmp_path / "logs" / f"{name}.log").read_text().splitlines() for name in ("a", "b")]
    assert all(len(lines) == 1 and re.fullmatch(r"\[\s*\d+\.\d\d\] cache \S+", lines[0]) for lines in logs), logs
    folders = {lines[0].split()[-1] for lines in logs}
    assert len(folders) == 1 and not Path(folders.pop()).exists()
    assert SHARED_CACHE_ENV not in os.environ


def test_entries_keep_their_bytecode_where_it_can_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a machine whose packages are read-only every process compiled its modules again; an
    entry gets a writable ``PYTHONPYCACHEPREFIX`` unless one is set already."""
    script = "import os, sys; print(os.environ['PYTHONPYCACHEPREFIX']); open(sys.argv[1], 'w').write('{}')"
    entries = [Entry("a", "offline", (), "a_<card>.json", "offline", 1, 30, "test")]
    monkeypatch.setattr(bench_all, "entry_command", lambda e, out: [sys.executable, "-c", script, out])
    for preset, expected in ((None, "minisgl-pycache"), (str(tmp_path / "mine"), str(tmp_path / "mine"))):
        if preset is None:
            monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
        else:
            monkeypatch.setenv("PYTHONPYCACHEPREFIX", preset)
        row = bench_all.run_entries(entries, part=1, card="testcard", gpus=1, results_dir=tmp_path,
                                    log_dir=tmp_path / "logs")["entries"][0]
        assert row["status"] == "ok"
        assert (tmp_path / "logs" / "a.log").read_text().rstrip().endswith(expected)
