"""``python -m tasks.costs calibrate`` (scale the predictions to this machine) and ``show`` (print
the cost data in use): the short forms of ``python -m tasks.costs.calibrate machine`` / ``show``."""

import argparse

from tasks.costs.calibrate import main as calibrate_main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tasks.costs", description="cost data: calibrate to this machine"
    )
    ap.add_argument("what", choices=["calibrate", "show"])
    a = ap.parse_args(argv)
    return calibrate_main(["machine" if a.what == "calibrate" else "show"])


if __name__ == "__main__":
    raise SystemExit(main())
