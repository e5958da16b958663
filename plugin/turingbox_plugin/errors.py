"""The plugin's own error type, so its tools work without the appliance installed."""


class ToolError(Exception):
    """Bad input for a tool: one sentence, exit code 2, no traceback."""

    exit_code = 2
