"""The command line's error handling, shared by every Hydra command (train.py, sample.py, data/prepare.py,
scripts/): a mistake, on the command line or found by the program, ends it in one line naming the fix, `error: ...`,
and exit status 2.

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="sample")
    @one_line_errors
    def main(dict_cfg): ...

    if __name__ == "__main__":
        run_cli(main)
"""
import argparse
import functools
import os
import re
import sys
from pathlib import Path

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException


def run_cli(hydra_main, help_script=None):
    """Run a @hydra.main entry point. A mistake on the command line (an unknown key, a value of the wrong type, a
    missing preset) is reported like every other mistake: one line naming the fix, exit status 2. The fix points at
    `python <help_script> --help` (the running script by default)."""
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"  # the user asked for Hydra's complete stack trace
    os.environ["HYDRA_FULL_ERROR"] = "1"  # makes Hydra raise its errors to us instead of printing several lines
    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as e:
        if full_error:
            raise
        print(f"error: {hydra_error_line(e, help_script or Path(sys.argv[0]).name)}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:  # submitit's Slurm launcher started where no Slurm is
        if full_error or "slurm" not in str(e).lower():
            raise
        print(f"error: hydra/launcher=slurm found no Slurm here ({str(e).splitlines()[0]}); run the sweep on the "
              f"cluster's login node, or pass hydra/launcher=submitit_local to run its jobs on this machine",
              file=sys.stderr)
        sys.exit(2)


def one_line_errors(task):
    """For an entry point's task function: a mistake the program finds (ValueError; OSError, such as a missing file or
    a full disk) ends it in one line, `error: ...`, and exit status 2. Caught inside the task, since Hydra adds lines
    of its own to an error that leaves one."""
    @functools.wraps(task)
    def run(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except (ValueError, OSError) as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, whatever raised it
            sys.exit(2)
    return run


def hydra_error_line(e, help_script):
    """First lines only of Hydra's message and of the OmegaConf error behind it, then the fix: Hydra's own advice
    (append a key with +key=value, the config search path) does not help here."""
    message = str(e).splitlines()[0].rstrip(".")
    if isinstance(e, MissingConfigException) and re.search(r"hydra/(sweeper|launcher)/", message):
        return f"{message}: Hydra's sweep plugins are not installed; pip install -e '.[sweeps]'"
    if isinstance(e, MissingConfigException) and e.options:
        return f"{message}; the choices are {', '.join(e.options)}"
    if isinstance(e, OverrideParseException):
        return f"{message}; quote a value holding spaces or symbols: 'key=\"a value\"'"
    if isinstance(e.__cause__, OmegaConfBaseException):
        message += f": {str(e.__cause__).splitlines()[0]}"
    return f"{message}; python {help_script} --help lists every key, its default and the presets"


def quote_free_text(argv, key):
    """Hydra's override grammar rejects parentheses, quotes and most symbols in a bare value, but some values are free
    text (a prompt, a page's text): pass key=... through as one quoted string (escaping quotes, backslashes and ${)."""
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name == key and sep:
            argv[i] = f"{key}='" + value.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"
    return argv


def at_least(low, kind=int):
    """An argparse type: a number of kind that is at least low, or the command's usage error naming the bound."""
    def parse(text):
        value = kind(text)
        if not value >= low:  # written so that nan fails too
            raise argparse.ArgumentTypeError(f"{text} is below {low}; pass a number >= {low}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its message for a value that does not parse
    return parse
