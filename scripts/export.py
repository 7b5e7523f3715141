"""Export a training run as a Hugging Face GPT-2 folder: config.json, model.safetensors and the tokenizer's files.

    python -m scripts.export out_dir=out/mini                          # best.pt (else ckpt.pt) -> out/mini/hf
    python -m scripts.export out_dir=out/mini checkpoint=latest hf_dir=/tmp/mini-hf

The folder loads with `transformers.GPT2LMHeadModel.from_pretrained(hf_dir)` and
`AutoTokenizer.from_pretrained(hf_dir)`, so `pipeline("text-generation", hf_dir)` generates from it alone;
attnlab/hf.py holds the conversion.
"""
import os

import hydra
from omegaconf import OmegaConf

from attnlab.checkpoint import load_model
from attnlab.cli import one_line_errors, run_cli
from attnlab.config import CONFIG_DIR, ExportConfig, register_configs
from attnlab.hf import to_hf
from data.tokenizers import load_tokenizer

register_configs()


def export(cfg: ExportConfig):
    """Write cfg.out_dir's checkpoint as a Hugging Face folder; returns the folder."""
    model, meta = load_model(cfg.out_dir, cfg.checkpoint, "cpu")
    hf_dir = cfg.hf_dir or os.path.join(cfg.out_dir, "hf")
    to_hf(model, hf_dir, load_tokenizer(meta))
    print(f"wrote {hf_dir} from {cfg.out_dir}: the model and its tokenizer; generate with "
          f"transformers.pipeline('text-generation', {hf_dir!r})")
    return hf_dir


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="export")
@one_line_errors
def main(dict_cfg):
    export(OmegaConf.to_object(dict_cfg))


if __name__ == "__main__":
    run_cli(main, help_script="-m scripts.export")
