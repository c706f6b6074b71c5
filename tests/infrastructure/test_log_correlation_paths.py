"""Every API function takes its log correlation id from the job the request names."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API_HANDLERS = [p for p in sorted((ROOT / "functions").glob("*/handler.py")) if "APIGatewayRestResolver" in p.read_text()]


@pytest.mark.parametrize("handler", API_HANDLERS, ids=lambda p: p.parent.name)
def test_api_functions_correlate_logs_by_job(handler: Path):
    assert "correlation_id_path=API_CORRELATION_PATH" in handler.read_text()
