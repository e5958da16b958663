"""Caches (fingerprinted Triton/Inductor/autotune/FlashInfer), seeding and warm jobs."""
