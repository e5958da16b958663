"""`python -m turingbox`: the image's entrypoint (tini -- python3 -P -m turingbox).

The image's entrypoint already is turingbox, so `docker run IMAGE turingbox doctor` and
`docker compose run --rm turingbox turingbox doctor` name it twice: one leading `turingbox` is the
program's own name, dropped, so those work as `docker run IMAGE doctor` does."""
import sys

from turingbox.cli import main


def argv_of(args: list[str]) -> list[str]:
    return args[1:] if args[:1] == ["turingbox"] else args


if __name__ == "__main__":
    raise SystemExit(main(argv_of(sys.argv[1:])))
