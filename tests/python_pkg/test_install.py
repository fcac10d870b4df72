"""The package is the installed one, with its data files found relative to it."""
import os
from pathlib import Path

import kvzap

from conftest import ROOT


def test_imported_from_site_packages_not_the_source_tree():
    pkg = Path(kvzap.__file__).resolve().parent
    assert ROOT / "python" not in pkg.parents and pkg != ROOT / "python" / "kvzap", pkg
    assert (pkg / "libkvzap.so").exists()


def test_data_dir_is_the_packages_own():
    if os.environ.get("KVZAP_DATA_DIR"):
        print("SKIPPED: KVZAP_DATA_DIR is set, the package's data folder is not used")
        return
    pkg = Path(kvzap.__file__).resolve().parent
    assert Path(kvzap.data_dir()).resolve() == pkg / "data"
    assert (pkg / "data" / "surrogates").is_dir()
    assert (pkg / "data" / "eval").is_dir()


def test_version():
    assert kvzap.version.count(".") == 2
