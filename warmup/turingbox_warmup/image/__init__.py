"""Image-build steps the Dockerfile runs without a GPU, `python -m turingbox_warmup.image.<tool>`: triton_aot.py
(Triton kernels compiled ahead of time from aot_specs/*.jsonl), flashinfer_aot.py (FlashInfer's JIT modules built
ahead of time) and modelinfos.py (vLLM's model-class facts). Each new cache entry starts with a copy of their output
(turingbox.cache.store)."""
