"""Offline stand-ins for rules_cc / rules_java / remote_coverage_tools, only where needed.

Called as the first thing in WORKSPACE. Bazel appends its own WORKSPACE suffix
after the project's WORKSPACE, and that suffix declares these repositories
with `maybe(http_archive, ...)`, so whatever is declared here wins.

Official Bazel releases resolve those archives from a distdir embedded in the
binary; Debian's bazel-bootstrap (4.2.3, version string "") has none and would
download them. Bazel >= 5 with network access (bazelisk + .bazelversion) keeps
the real rule sets: replacing them there could break its Java/C++ toolchains.
"""

def _major_version():
    """Bazel's major version, or 0 for a development/distribution build without one."""
    version = native.bazel_version
    if not version:
        return 0
    major = version.split(".")[0]
    if not major.isdigit():
        return 0
    return int(major)

def tfring_offline_repositories():
    if _major_version() >= 5:
        return
    native.local_repository(
        name = "rules_cc",
        path = "third_party/stubs/rules_cc",
    )
    native.local_repository(
        name = "rules_java",
        path = "third_party/stubs/rules_java",
    )

    # Implicit dependency of every *_test rule (coverage merger/report tools).
    native.local_repository(
        name = "remote_coverage_tools",
        path = "third_party/stubs/remote_coverage_tools",
    )
