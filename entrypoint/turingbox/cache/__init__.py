"""Compile caches, one entry per plan fingerprint (the key is the plan's: plan/fingerprint.py, Plan.compute_hash):
store.py (the entries on the volume: layout, manifests, locking, the session serve and warmup use),
flashinfer_prebuilt.py (FlashInfer modules built ahead of time, copied into a new entry), seed_protocol.py (the
seed's stage lines). Above plan/ in the layering: it imports the plan, settings and errors."""
