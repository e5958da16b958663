"""Compile caches, one entry per plan fingerprint: fingerprint.py (the plan's cache key), store.py (the entries
on the volume: layout, manifests, locking, the session serve and warmup use), flashinfer_prebuilt.py (FlashInfer
modules built ahead of time, copied into a new entry). Low in the layering: imports settings and errors only."""
