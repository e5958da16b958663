"""Warming turingbox's caches from outside the serving process: the host tools `python -m turingbox_warmup.<tool>`,
seed_volume.py (`make warmup-cache`: the image seeds the cache volume on this host's GPUs, Docker SDK) and bake.py
(`make bake`: an image with a seeded cache entry inside), and image/ (what the Dockerfile runs at image build).
It imports the appliance (`turingbox`); nothing of the appliance imports it (pyproject's import contracts)."""
