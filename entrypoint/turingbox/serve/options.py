"""The values `turingbox serve` runs with: the serve settings, typed and loaded once at the edge
(turingbox.config.ServeSettings, whose defaults are the table's)."""
from __future__ import annotations

from turingbox import config
from turingbox.config import ServeSettings

SERVE_SETTINGS = config.SERVE_SETTINGS

# The sidecar and the controller call them options; one type, declared in config.
ServeOptions = ServeSettings


def api_key_state(options: ServeSettings) -> tuple[bool, str]:
    """(on, the startup log line's text) for the sidecar's key. config.load treats an empty variable
    as unset; an empty TURINGBOX_API_KEY (a `.env` line `TURINGBOX_API_KEY=`, `${TURINGBOX_API_KEY:-}` in a
    compose file, an empty Secret key) means off as well, and the line says so by name (never the key)."""
    if options.api_key:
        return True, "API key: on (/v1/* and /turingbox/plan need 'Authorization: Bearer <key>')"
    name = config.REGISTRY["api_key"].env_name
    why = f"{name} is set but empty" if "api_key" in options.empty_variables else f"{name} is not set"
    return False, f"API key: off ({why})"
