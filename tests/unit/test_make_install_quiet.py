"""``make install`` (and so ``make demo`` on a fresh clone) prints no warning that is not the project's own
(issue 34, point 12): setuptools' boxed "Editable installation." notice is filtered by the Makefile."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What setuptools (84.2.1, the build backend pip fetches) emits on an editable install, as pip shows it.
SETUPTOOLS_NOTICE = ("Editable installation.\n!!\n\n        ****\n        Please be careful with folders in your "
                     "working directory with the same\n        name as your package as they may take precedence "
                     "during imports.\n        ****\n\n!!")


def test_the_editable_install_runs_with_a_filter_that_silences_setuptools_notice() -> None:
    dry = subprocess.run(["make", "-n", "-B", "install"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    [line] = [line for line in dry.stdout.splitlines() if "pip install" in line and " -e " in line]
    [value] = re.findall(r'PYTHONWARNINGS="([^"]+)"', line)
    # The filter as Python reads PYTHONWARNINGS, in a fresh interpreter: the notice is silenced, others are not.
    probe = ("import warnings\n"
             f"warnings.warn({SETUPTOOLS_NOTICE!r}, UserWarning)\n"
             "warnings.warn('Something else.', UserWarning)\n")
    ran = subprocess.run([sys.executable, "-c", probe], env={"PYTHONWARNINGS": value}, capture_output=True,
                         text=True, timeout=60)
    assert "Editable installation" not in ran.stderr and "Something else." in ran.stderr
