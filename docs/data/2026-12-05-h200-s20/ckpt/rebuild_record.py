"""Rebuild bench/checkpoint_load.py's load record from its per-format logs (the GPU machine went back before
`load` wrote checkpoint_load.json): the same parse_load_log / drafter_seconds / load_ratio as the bench."""
import json, re, sys
sys.path.insert(0, "bench")
import checkpoint_load as ck
res = sys.argv[1]
disk = json.load(open(f"{res}/ckpt/disk.json"))
tensors = json.load(open(f"{res}/ckpt/tensors.txt"))
write = json.load(open(f"{res}/ckpt/write.json"))
size = disk["size_bytes"]; gbps = disk["read_gbps"]; par = disk["parallel"]["gbps"]
vision = round(tensors["breakdown_gib"]["vision"] * 2**30)
argv = {}
for line in open(f"{res}/ckpt/load.txt"):
    m = re.match(r"\[checkpoint_load\] (\S+): (/.*)$", line.rstrip("\n"))
    if m: argv[m.group(1)] = m.group(2)
formats = {}
for label in ("safetensors", "safetensors-prefetch", "runai_streamer"):
    timed = []
    for line in open(f"{res}/ckpt/logs/load-{label}.log", encoding="utf-8"):
        t, _, text = line.rstrip("\n").lstrip().partition(" ")
        try:
            timed.append((float(t), text))
        except ValueError:      # a progress bar's carriage-return continuation: same arrival time as the line before
            timed.append((timed[-1][0] if timed else 0.0, line.rstrip("\n")))
    p = ck.parse_load_log(text for _, text in timed)
    p["drafter_s"] = ck.drafter_seconds(timed)
    at = [t for t, text in timed if ck.MODEL_LOADING.search(text)]
    p["loaded_at_s"] = round(max(at), 3) if at else None
    p["skipped_params_warnings"] = sum("not found in params_dict" in text for _, text in timed)
    formats[label] = {"available": True, **p, "ratio": ck.load_ratio(p["load_s"], size, gbps),
                      "weights_ratio": ck.load_ratio(p["weights_s"], size, gbps),
                      "ratio_vs_parallel_read": ck.load_ratio(p["load_s"], size, par),
                      "ratio_without_vision": ck.load_ratio(p["load_s"], size - vision, gbps),
                      "argv": argv.get(label), "log": f"logs/load-{label}.log.gz"}
formats["fastsafetensors"] = {"available": True, "load_s": None,
                              "why": "not reached: the device machine went back (session budget) before this start"}
best = ck.fastest(formats)
rec = {"model_dir": "/tmp/ckpt-awq", "size_bytes": size, "vision_bytes_from_tensor_list": vision, "files": disk["files"],
       "disk_read_gbps": gbps, "disk": disk, "write": write, "expected_s": round(ck.expected_s(size, gbps), 3),
       "goal_ratio": 1.3, "formats": formats, "fastest": best, "fastest_ratio": formats[best]["ratio"],
       "fastest_beats_default": formats[best]["load_s"] < formats["safetensors"]["load_s"],
       "rebuilt_from_logs": "bench/checkpoint_load.py load ran the three starts; the machine went back before it wrote "
                            "this record, so it was rebuilt on CPU from load.txt and the three logs with the bench's own "
                            "parse_load_log / drafter_seconds / load_ratio (docs/data/2026-12-05-h200-s20/README.md)",
       "machine": disk["machine"], "date": disk["date"]}
json.dump(rec, open(sys.argv[2], "w"), indent=1)
print({k: (v["load_s"], v.get("ratio"), v.get("weights_s"), v.get("drafter_s")) for k, v in formats.items()}, best)
