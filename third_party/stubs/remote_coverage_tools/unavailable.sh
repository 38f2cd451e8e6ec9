#!/bin/sh
echo "coverage tools are not available in the offline Bazel setup (third_party/stubs)" >&2
exit 1
