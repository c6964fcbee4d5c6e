"""Package versions recorded with a result: one definition for builds and runs."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# What a build's bytes depend on; part of the build id (qverify.quantize.build), so this list and the
# "missing" spelling stay as they are: changing either changes every build id.
BUILD_PACKAGES = ("qverify", "torch", "transformers", "llmcompressor", "compressed-tensors")
# What a run's results depend on besides the build: the serving stack too.
RUN_PACKAGES = ("qverify", "torch", "transformers", "compressed-tensors", "llmcompressor", "sglang")


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """Installed version per package; "missing" when it is not installed (an absence is recorded, not dropped)."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out
