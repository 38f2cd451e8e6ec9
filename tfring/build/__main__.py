"""``python -m tfring.build``: find or build the op library for the running
TensorFlow and print its path (tfringrun runs this before starting ranks)."""
import argparse
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tfring.build",
        description="Build tfring's op library for the installed TensorFlow (into the cache) "
                    "unless a matching one exists, and print its path.")
    parser.parse_args(argv)
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
