"""bench.py runs end to end at tiny sizes (no timing assertions: timings belong to the tables, not to tests)."""
import bench


def test_quick_bench_prints_every_section(capsys):
    bench.main(["--quick"])
    out = capsys.readouterr().out
    for title in ("Training throughput", "Sampling", "Causal attention", "Generation"):
        assert f"### {title}" in out
    assert "| nanoGPT CPU recipe |" in out and "| speedrun_cpu |" in out and "| GPT-2 124M |" in out
    assert "n/a" in out  # no MFU on the CPU
