"""Every test lives in its tier's folder (tests/README.md): plain `pytest` runs the unit tier alone, so a
test file anywhere else would run nowhere, and a Ray or GPU test in the unit tier would slow it or fail it."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "kernels", "gpu")
#: what only a test that starts Ray asks for
RAY_FIXTURES = ("ray_two_gpus", "local_cluster", "pytest.mark.slow")


def _files(*tiers: str) -> list[Path]:
    """The test files of ``tiers``, less this one (it names what it looks for)."""
    here = Path(__file__).resolve()
    return sorted(p for tier in tiers for p in (TESTS / tier).rglob("test_*.py") if p != here)


def test_every_test_file_is_in_a_tier_folder() -> None:
    stray = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py") if p.parent.name not in TIERS]
    assert stray == [], f"move these into tests/{{unit,integration,kernels,gpu}}/ (tests/README.md): {stray}"
    assert all((TESTS / tier / "__init__.py").is_file() for tier in TIERS)


def test_gpu_tests_are_in_the_gpu_tier() -> None:
    elsewhere = [p.name for p in _files("unit", "integration", "kernels") if "mark.gpu" in p.read_text()]
    misnamed = [p.name for p in _files("unit", "integration", "kernels") if p.name.startswith("test_gpu_")]
    assert elsewhere == [] and misnamed == [], "gpu-marked tests and test_gpu_*.py files belong in tests/gpu"


def test_unit_and_kernel_tests_start_no_ray() -> None:
    starting = [
        f"{p.parent.name}/{p.name}: {name}"
        for p in _files("unit", "kernels")
        for name in RAY_FIXTURES
        if name in p.read_text()
    ]
    assert starting == [], f"tests that start Ray belong in tests/integration: {starting}"
