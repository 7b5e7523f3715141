"""Sweeps through Hydra's plugins (the sweeps extra): the Optuna preset (configs/hparams_search/) minimises the
val loss that train.py returns and reports its best trial; the submitit launcher that configs/hydra/launcher/slurm.yaml
configures runs a sweep's jobs, here through submitit's local executor. Each job writes its own run folder."""
import json

import hydra
import pytest
from conftest import TINY, compose, data_overrides, run_in_process, run_script
from omegaconf import OmegaConf

from attnlab.config import CONFIG_DIR, register_configs
from attnlab.record import read_metrics
from data.corpus import prepare

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason='pip install -e ".[sweeps]"')
pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason='pip install -e ".[sweeps]"')

# 4 steps with an evaluation halfway, so the learning rate moves the final val loss; a hung job fails the test
SHORT = [*TINY, "train.max_iters=4", "train.eval_interval=2"]
TIMEOUT_S = 300


def hydra_config(*overrides):
    """The config `python train.py -m OVERRIDES` starts from, Hydra's own part (launcher, sweeper) included."""
    register_configs()
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra.compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def job_folders(out_dir):
    return sorted((p for p in out_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def trained_config(folder):
    return json.loads((folder / "config.json").read_text())["config"]


def test_search_preset_asks_optuna_to_minimise_over_a_seeded_space():
    sweeper = hydra_config("hparams_search=optuna").hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "minimize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed is not None
    assert set(sweeper.params) == {"train.learning_rate", "model.n_layer", "train.warmup_iters"}


def test_slurm_launcher_composes_with_one_process_per_job():
    cfg = hydra_config("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "out_dir=out/sweep")
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.partition, launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == ("gpu", 1, 1, 1)
    assert launcher.timeout_min == 240 and launcher.max_num_timeout == 0
    assert OmegaConf.select(cfg, "hydra.launcher.submitit_folder") == "out/sweep/.submitit/%j"  # logs beside the jobs


OPTUNA_2_ON_SQLALCHEMY_1_4 = "ignore:Deprecated API features detected"  # optuna 2.x's storage module, on import


@pytest.mark.filterwarnings(OPTUNA_2_ON_SQLALCHEMY_1_4)
def test_optuna_search_reports_the_lowest_val_loss_of_its_trials(tmp_path, one_thread):
    out_dir = tmp_path / "search"
    # the space narrowed on the command line, as a user would: only the learning rate varies, TPE from trial 3
    code, _, err = run_in_process("train.py", "-m", "hparams_search=optuna", *SHORT, *data_overrides(tmp_path),
                                  f"out_dir={out_dir}", "hydra.sweeper.n_trials=3",
                                  "hydra.sweeper.sampler.n_startup_trials=2",
                                  "train.learning_rate=tag(log, interval(1e-3, 1e-1))", "train.warmup_iters=0")
    assert code == 0, err[-3000:]
    folders = job_folders(out_dir)
    assert [f.name for f in folders] == ["0", "1", "2"]
    assert all((f / "ckpt.pt").exists() for f in folders)
    final = {f: read_metrics(f, "eval")[-1]["val_loss"] for f in folders}
    assert len({trained_config(f)["train"]["learning_rate"] for f in folders}) == 3
    assert {trained_config(f)["train"]["warmup_iters"] for f in folders} == {0}
    results = OmegaConf.load(out_dir / "optimization_results.yaml")
    best = min(final, key=final.get)
    assert results.best_value == final[best]
    assert results.best_params["train.learning_rate"] == pytest.approx(trained_config(best)["train"]["learning_rate"])


@pytest.mark.filterwarnings(OPTUNA_2_ON_SQLALCHEMY_1_4)
def test_a_failing_trial_ends_the_search_with_its_one_line_error(tmp_path):
    code, _, err = run_in_process("train.py", "-m", "hparams_search=optuna", *SHORT, *data_overrides(tmp_path),
                                  f"out_dir={tmp_path / 'search'}", "train.learning_rate=interval(-1, -0.5)")
    assert code == 2
    assert "must be positive" in err.strip().splitlines()[-1]
    assert not (tmp_path / "search" / "optimization_results.yaml").exists()


@pytest.mark.slow
def test_submitit_launcher_runs_each_job_of_a_sweep(tmp_path):
    args = [*SHORT, *data_overrides(tmp_path)]
    cfg = compose(*args)
    prepare(cfg.data, cfg.model.block_size)  # once, before the jobs that run side by side read it
    out_dir = tmp_path / "sweep"
    result = run_script("train.py", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", *args,
                        f"out_dir={out_dir}", "train.learning_rate=1e-3,1e-2", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    folders = job_folders(out_dir)
    assert [f.name for f in folders] == ["0", "1"]
    assert all((f / "ckpt.pt").exists() for f in folders)
    assert [trained_config(f)["train"]["learning_rate"] for f in folders] == [1e-3, 1e-2]
    assert len(list((out_dir / ".submitit").glob("*/*_result.pkl"))) == 2  # submitit ran them, not Hydra's default
