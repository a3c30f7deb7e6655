"""HTTP API: /api/v1/ctr, /api/v1/views, /api/v1/sql, /healthz, /metrics, the dashboard."""

from api.main import create_app
from api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
