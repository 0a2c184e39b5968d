"""Shared fixtures of the repository-level tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def hook():
    """site/hooks/minisgl_site.py, loaded as a module of its own (mkdocs loads it by path)."""
    spec = importlib.util.spec_from_file_location("minisgl_site_hook", REPO / "site" / "hooks" / "minisgl_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    module._state.update(root=REPO, repo_url="https://github.com/minisgl/minisgl")
    return module
