"""Export a training run as a Hugging Face GPT-2 folder (config.json, model.safetensors).

    python export.py out_dir=out/mini                          # best.pt (else ckpt.pt) -> out/mini/hf
    python export.py out_dir=out/mini checkpoint=latest hf_dir=/tmp/mini-hf

The folder loads with `transformers.GPT2LMHeadModel.from_pretrained(hf_dir)`. hf.py holds the conversion.
"""
import os
import sys

from checkpoint import load_model
from hf import to_hf


def main(argv):
    args = dict(out_dir=None, checkpoint="best", hf_dir=None)
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in args:
            raise ValueError(f"unknown argument {arg!r}; usage: export.py out_dir=DIR [checkpoint=best|latest] "
                             "[hf_dir=DIR]")
        args[key] = value
    if not args["out_dir"]:
        raise ValueError("out_dir=DIR is required: the training run to export")
    model, _ = load_model(args["out_dir"], args["checkpoint"], "cpu")
    hf_dir = args["hf_dir"] or os.path.join(args["out_dir"], "hf")
    to_hf(model, hf_dir)
    print(f"wrote {hf_dir} from {args['out_dir']}; load it with "
          f"transformers.GPT2LMHeadModel.from_pretrained({hf_dir!r})")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
