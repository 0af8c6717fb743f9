"""`python -m yolov9c ...`: the package's command line (info, convert); see yolov9c/cli/main.py.

Test: python -m pytest -q tests/cli/test_cli.py
"""

import sys

from yolov9c.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
