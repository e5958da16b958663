"""`turingbox demo-model [DIR] [--awq] [--layers N] [--tokenizer-only]`."""
from __future__ import annotations

import argparse
import os
import time

from turingbox import config
from turingbox.errors import UsageError
from turingbox.model import demo


def register(sub) -> None:
    p = sub.add_parser(
        "demo-model",
        help="write the Qwen3.6-27B demo model (config + real tokenizer) for vLLM --load-format dummy",
        description="Write a vLLM-loadable Qwen3.6-27B directory (architecture, real tokenizer, chat "
                    "template, no weights) to serve with --load-format dummy.",
    )
    p.add_argument("dir", nargs="?", default=None, metavar="DIR",
                   help=f"target directory (default: MODELS_DIR/{demo.DEMO_DIR_NAME})")
    p.add_argument("--awq", dest="demo_awq", action="store_const", const="1", default=None,
                   help="add the seed's AWQ INT4 quantization config [env TURINGBOX_DEMO_AWQ]")
    p.add_argument("--layers", dest="demo_layers", default=None, metavar="N",
                   help="number of layers, a positive multiple of 4 (default 64) [env TURINGBOX_DEMO_LAYERS]")
    p.add_argument("--tokenizer-only", action="store_true",
                   help="only build the cached tokenizer that demo models beside DIR reuse (image build time)")
    config.add_arguments(p, ["models_dir"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raw_layers = args.demo_layers
    if raw_layers is not None:                 # name the flag the user typed
        try:
            args.demo_layers = str(demo.validate_layers(int(raw_layers)))
        except ValueError:
            raise UsageError(f"--layers {raw_layers!r} is invalid: must be a positive multiple of "
                             f"{demo.FULL_ATTENTION_INTERVAL}.") from None
    settings = config.load(args, groups=("demo",)).demo
    target = args.dir or demo.default_demo_dir(settings.models_dir)
    started = time.monotonic()
    if args.tokenizer_only:
        cache = demo.prebuild_tokenizer(os.path.dirname(os.path.abspath(os.path.expanduser(target))))
        print(f"tokenizer ready in {cache} ({time.monotonic() - started:.1f} s)")
        return 0
    path = demo.ensure_demo_model(target, awq=settings.demo_awq, layers=settings.demo_layers)
    marker = demo.read_marker(path) or {}
    print(f"demo model ready in {path} (layers={marker.get('layers')}, awq={marker.get('awq')}, "
          f"{time.monotonic() - started:.1f} s)")
    return 0
