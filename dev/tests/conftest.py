"""pytest set-up of the dev/ tools' tests: the suite's own, reused. tests/ goes on sys.path (its helpers:
repo_assets, inprocess, ...) and tests/conftest.py is loaded under another module name, so that its hooks (the
`cuda` marker, one CPU thread) and fixtures apply here too; nothing is copied.

Run: python -m pytest -q dev/tests   (not part of the README's test command: `pytest tests` never collects dev/)
"""

import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

_spec = importlib.util.spec_from_file_location("yolov9c_tests_conftest", TESTS / "conftest.py")
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)

one_thread = _suite.one_thread
gelan_t = _suite.gelan_t
pytest_configure = _suite.pytest_configure
pytest_collection_modifyitems = _suite.pytest_collection_modifyitems
