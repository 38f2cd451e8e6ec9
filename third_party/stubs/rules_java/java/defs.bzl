"""Offline stub of @rules_java//java:defs.bzl: the native Java rules under their rules_java names.

See third_party/stubs/README.md. Only used with Bazel 4 / distribution builds; no
Java is compiled by this project, the names only have to exist because
@bazel_tools//tools/jdk loads them.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_package_configuration = native.java_package_configuration
java_plugin = native.java_plugin
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
