"""turingbox vLLM general plugin (placeholder; the plugin issue fills this in)."""

__version__ = "0.1.0"


def register() -> None:
    """vllm.general_plugins entry point: must be cheap, re-entrant and never touch CUDA."""
    return None
