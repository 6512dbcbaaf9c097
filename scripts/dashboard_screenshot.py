"""Screenshot of the /ps dashboard page during a fit (docs/dashboard.png).

Runs the browser test (tests/cluster/test_dashboard_browser.py): an
in-process cluster with Dask's dashboard, an SGDClassifier fit, headless
Chromium driven by playwright opening Dask's dashboard, following the "Ps"
link of its navigation bar and checking what ``/ps`` shows; the test saves
its screenshot where ``DASK_PS_DASHBOARD_PNG`` says.

Usage: ``python scripts/dashboard_screenshot.py [out.png]`` (needs
``pip install 'dask-ps[browser]'`` and Debian's ``chromium``:
``apt-get install chromium``).
"""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(out="docs/dashboard.png"):
    env = dict(os.environ, DASK_PS_DASHBOARD_PNG=str(pathlib.Path(out).resolve()))
    subprocess.run([sys.executable, "-m", "pytest", "-m", "slow", "-q", "-p", "no:randomly",
                    "tests/cluster/test_dashboard_browser.py"], cwd=ROOT, env=env, check=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
