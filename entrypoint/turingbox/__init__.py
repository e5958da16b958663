"""turingbox: a box of NVIDIA GPUs -> a sized, warmed, healthy OpenAI-compatible vLLM endpoint."""

__version__ = "0.1.0"
