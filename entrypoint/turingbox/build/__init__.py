"""Image-build and host tools, run with `python -m turingbox.build.<tool>`: aot.py (Triton kernels compiled ahead of
time from aot_specs/*.jsonl), flashinfer_aot.py (FlashInfer's JIT modules built ahead of time), bake.py (`make
bake`) and seed_docker.py (`make warmup-cache`). Nothing that serves imports them."""
