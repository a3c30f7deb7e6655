"""What the demo's helper scripts need to find the running demo (``RUN_DIR``, ``API_PORT``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DemoSettings(BaseSettings):
    """Where the demo's helper scripts (make demo-screenshot) find
    the running demo: its run directory and its API's port."""

    model_config = SettingsConfigDict(extra="ignore")

    # The running demo's run directory: its API token is in demo/api-token there. Relative: to
    # the working directory.
    run_dir: Path = Field(default=Path("run"), validation_alias="RUN_DIR")
    # The port the demo's API listens on (on 127.0.0.1).
    api_port: int = Field(default=8000, ge=1, le=65535, validation_alias="API_PORT")

    @property
    def token_file(self) -> Path:
        return self.run_dir / "demo" / "api-token"
