"""``python -m tfring.build``: find or build the op library for the running
TensorFlow and print its path (tfringrun runs this before starting ranks).
``python -m tfring.build core`` does the same for the framework-neutral
module of tfring.core, without TensorFlow."""
import argparse
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tfring.build",
        description="Build tfring's op library for the installed TensorFlow (into the cache) "
                    "unless a matching one exists, and print its path.")
    parser.add_argument("what", nargs="?", choices=["ops", "core"], default="ops",
                        help="ops (default): the TensorFlow op library; core: the "
                             "framework-neutral module of tfring.core (no TensorFlow; "
                             "TFRING_WITH_NCCL=1 for a GPU build)")
    args = parser.parse_args(argv)
    if args.what == "core":
        from tfring.build import core_module, library
        try:
            print(core_module.ensure_module())
        except library.BuildError as e:
            print(f"tfring: {e}", file=sys.stderr)
            return 1
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfring.common import loader
    try:
        print(loader.library_path())
    except ImportError as e:
        print(f"tfring: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
