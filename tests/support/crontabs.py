"""Helpers for tests that touch the real crontab (the saved_crontab fixture in conftest puts it back)."""

from __future__ import annotations

import subprocess

TINY_STAGES = '''
import pandas as pd


def make():
    return pd.DataFrame({"x": [1, 2, 3]})
'''


def tiny_pipeline(cron: str, timezone: str, name: str = "tiny") -> str:
    return f'''
    name: {name}
    stages:
      make:
        run: mypkg.steps:make
        outputs: [numbers]
    schedule:
      cron: "{cron}"
      timezone: {timezone}
    '''


def crontab_bytes() -> bytes | None:
    """The crontab as `crontab -l` prints it; None when there is none."""
    done = subprocess.run(["crontab", "-l"], capture_output=True)
    return done.stdout if done.returncode == 0 else None


def set_crontab(text: bytes | None) -> None:
    if text is None:
        subprocess.run(["crontab", "-r"], capture_output=True)
    else:
        subprocess.run(["crontab", "-"], input=text, check=True, capture_output=True)

