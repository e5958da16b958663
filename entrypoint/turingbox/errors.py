"""Errors that end a command with one sentence and exit code 2 (bad input) — never a traceback."""


class UsageError(Exception):
    """Bad input or an impossible request: the message is one sentence naming the setting and numbers."""

    exit_code = 2


class PlanError(UsageError):
    """The plan cannot be made (no GPU, does not fit, mixed architectures...)."""
