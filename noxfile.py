"""The matrix: every package's tests on each Triton version, lint, packaging, benchmarks.

    nox -s tests-triton-2.2      # Triton 2.2.0, the oldest supported
    nox -s tests-triton-3.8      # Triton 3.8.0, what a plain `pip install torch` resolves today (torch 2.14)
    nox -s tests-triton-3.x      # the newest Triton 3.x on PyPI
    nox -s lint packaging
    nox -s tests-installed       # the torch and Triton already installed (a GPU box offline)
    nox -s benchmarks            # on a GPU: every package's benchmarks, one table per run

On a CPU-only machine a test session runs two passes, each spread over the cores
(pytest-xdist): the kernels under Triton's interpreter (Triton 3.x; Triton 2.2's interpreter
cannot run 2-D kernels, so there only the tests that launch nothing run), then the
ahead-of-time compile check to cubins for sm_80 and sm_90. On a machine with an NVIDIA GPU it
runs the whole suite compiled, in one pass.
Arguments after `--` go to pytest.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import nox

ROOT = pathlib.Path(__file__).parent
KERNEL_PACKAGES = ["fused-attention", "fused-gemm", "fused-swiglu", "fused-rope", "fused-norm-xent"]
MODEL_PACKAGE = "tritonformer-model"
PACKAGES = [*KERNEL_PACKAGES, MODEL_PACKAGE]
TESTKIT = "tools/testkit"
# The README's one command that installs the model and its five siblings from a checkout (then trains).
FULL_MODEL_INSTALL = ["python3", "-m", "pip", "install", *(f"./packages/{package}" for package in PACKAGES)]
TRAIN = "tritonformer-train"

# Each test session: its Triton, the torch release it pairs with on a GPU machine, the numpy
# range its interpreter works with, and whether its interpreter can run our (2-D) kernels.
MATRIX = {
    "2.2": {"triton": "2.2.0", "gpu_torch": "2.2.2", "numpy": "numpy>=1.21,<2", "interprets": False},
    "3.8": {"triton": "3.8.0", "gpu_torch": "2.14.1", "numpy": "numpy>=1.26,<3", "interprets": True},
    "3.x": {"triton": "3.9.0", "gpu_torch": "2.13.0", "numpy": "numpy>=1.26,<3", "interprets": True},
}
# On a CPU-only machine: the CPU build (this project's CPU machines keep its wheel locally).
CPU_TORCH = "torch==2.13.0"
# Besides torch and Triton: what the test sessions install (transformers: the model's Hugging Face
# GPT-2 interop tests, on a randomly initialized config, nothing downloaded).
TEST_TOOLS = ["pytest>=7", "pytest-benchmark", "pytest-xdist", "transformers>=4.40"]
# CPU passes run in this many pytest-xdist workers (one per core, at most four: each
# interpreter worker holds its own torch and compiled-kernel caches).
CPU_WORKERS = min(4, os.cpu_count() or 1)
# Triton 3.9 warns that its fp-fusion default will change; keep today's behaviour, quietly.
TRITON_ENV = {"TRITON_DEFAULT_FP_FUSION": "1"}

nox.options.sessions = ["lint", "tests-triton-2.2", "tests-triton-3.8", "tests-triton-3.x", "packaging"]


def has_gpu() -> bool:
    """An NVIDIA GPU and driver are present (nvidia-smi lists one)."""
    if shutil.which("nvidia-smi") is None:
        return False
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listing.returncode == 0 and "GPU" in listing.stdout


def editable_packages() -> list[str]:
    """pip arguments installing the test kit and every package from this checkout, editable."""
    args = ["-e", TESTKIT]
    for package in PACKAGES:
        args += ["-e", f"packages/{package}"]
    return args


def run_pytest_pass(session: nox.Session, label: str, args: list[str], env: dict[str, str]) -> dict:
    """One pytest run; returns its counts. Exit code 5 (nothing selected) is reported, not hidden."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = pathlib.Path(tmp) / "summary.json"
        session.log(f"pass '{label}': pytest {' '.join(args)}")
        code = session.run(
            "python", "-m", "pytest", *args,
            env={**TRITON_ENV, **env, "TRITONFORMER_SUMMARY": str(summary)},
            success_codes=[0, 5],
        )  # fmt: skip
        counts = json.loads(summary.read_text()) if summary.exists() else {}
    if code == 5:
        session.warn(f"pass '{label}' selected no tests (pytest exit code 5)")
    return counts


def run_suite(session: nox.Session, interprets: bool) -> None:
    """The whole suite in the passes this machine allows, then one summary line per pass."""
    if has_gpu():
        passes = [("compiled on the GPU", [], {"TRITON_INTERPRET": "0"})]
    else:
        kernel_env = {"TRITON_INTERPRET": "1" if interprets else "0"}
        kernel_label = "kernels in the interpreter" if interprets else "tests that launch no kernel"
        workers = ["-n", str(CPU_WORKERS)] if CPU_WORKERS > 1 else []
        passes = [
            (kernel_label, ["-m", "not aot", *workers], kernel_env),
            ("ahead-of-time compile", ["-m", "aot", *workers], {"TRITON_INTERPRET": "0"}),
        ]
    results = [(label, run_pytest_pass(session, label, [*args, *session.posargs], env)) for label, args, env in passes]
    total = 0
    for label, counts in results:
        ran = counts.get("passed", 0) + counts.get("failed", 0)
        total += ran + counts.get("compiled", 0)
        session.log(
            f"{label}: {ran} ran ({counts.get('passed', 0)} passed), {counts.get('compiled', 0)} cubins compiled, "
            f"{counts.get('skipped', 0)} skipped"
        )
        for reason, n in counts.get("skip_reasons", {}).items():
            session.log(f"    skipped {n}: {reason}")
    if total == 0:
        session.error("no test ran and nothing was compiled: check the pytest arguments after `--`")


def install_test_environment(session: nox.Session, version: str) -> None:
    spec = MATRIX[version]
    torch = f"torch=={spec['gpu_torch']}" if has_gpu() else CPU_TORCH
    session.install(torch)
    # After torch, so that the session's Triton wins over the one torch pins on a GPU machine.
    session.install(f"triton=={spec['triton']}", spec["numpy"], *TEST_TOOLS)
    session.install("--no-deps", *editable_packages())


@nox.session(name="tests-triton-2.2")
def tests_triton_2_2(session: nox.Session) -> None:
    """Every package's tests on Triton 2.2.0."""
    install_test_environment(session, "2.2")
    run_suite(session, MATRIX["2.2"]["interprets"])


@nox.session(name="tests-triton-3.8")
def tests_triton_3_8(session: nox.Session) -> None:
    """Every package's tests on Triton 3.8.0, the one a plain `pip install torch` brings today."""
    install_test_environment(session, "3.8")
    run_suite(session, MATRIX["3.8"]["interprets"])


@nox.session(name="tests-triton-3.x")
def tests_triton_3_x(session: nox.Session) -> None:
    """Every package's tests on the newest Triton 3.x."""
    install_test_environment(session, "3.x")
    run_suite(session, MATRIX["3.x"]["interprets"])


@nox.session(name="tests-installed", venv_backend="none")
def tests_installed(session: nox.Session) -> None:
    """The suite against the torch and Triton already installed: nothing is installed.

    Put another Triton first with PYTHONPATH, e.g. `PYTHONPATH=/tmp/t22 nox -s tests-installed`.
    """
    import triton  # noqa: F401  (fail early and clearly if there is none)

    run_suite(session, interprets=not triton.__version__.startswith("2."))


@nox.session(venv_backend="none")
def benchmarks(session: nox.Session) -> None:
    """On a GPU, with the torch and Triton installed: every package's benchmarks, one table per run."""
    if not has_gpu():
        session.error("benchmarks time compiled kernels on an NVIDIA GPU; none is here")
    paths = [str(p) for p in sorted(ROOT.glob("packages/*/benchmarks")) if any(p.glob("bench_*.py"))]
    session.run(
        "python", "-m", "pytest", *paths, "-p", "no:randomly", *session.posargs,
        env={**TRITON_ENV, "TRITON_INTERPRET": "0"},
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format), and .ci/run runs exactly the README's test command."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "tools/check_readme_commands.py", " ".join([*FULL_MODEL_INSTALL, "&&", TRAIN]))


def _fresh_venv(session: nox.Session, path: pathlib.Path) -> pathlib.Path:
    session.run(sys.executable, "-m", "venv", str(path), external=True)
    return path / "bin" / "python"


@nox.session
def packaging(session: nox.Session) -> None:
    """Wheels build with plain dependency names, carry the LICENSE and the shared runtime; one kernel and the
    full model install in fresh venvs as the README says, and run there (a kernel call, two training steps)."""
    session.install("build", "wheel")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        dist = tmp / "dist"
        for package in PACKAGES:
            session.run("python", "-m", "build", "--wheel", "--outdir", str(dist), f"packages/{package}")
        session.run("python", "tools/check_wheels.py", str(dist), *PACKAGES)

        # One kernel alone, straight from the checkout, as the README says; one call in the interpreter.
        python = _fresh_venv(session, tmp / "one-kernel")
        session.run(str(python), "-m", "pip", "install", "-q", CPU_TORCH, external=True)
        session.run(str(python), "-m", "pip", "install", "-q", "./packages/fused-swiglu", external=True)
        session.run(str(python), "-c", ONE_KERNEL_CALL, env={"TRITON_INTERPRET": "1", **TRITON_ENV}, external=True)

        imports = "; ".join(f"import {name}" for name in _import_names())
        # The full model from the checkout with the README's command, then a short training run.
        venv = tmp / "full-model"
        python = _fresh_venv(session, venv)
        session.run(str(python), "-m", "pip", "install", "-q", CPU_TORCH, external=True)
        session.run(str(python), *FULL_MODEL_INSTALL[1:], "-q", external=True)
        session.run(str(python), "-c", f"{imports}; print('model and five kernels import')", external=True)
        session.run(
            str(venv / "bin" / TRAIN), "--steps", "2", "--out-dir", str(tmp / "train-out"),
            env={"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", **TRITON_ENV}, external=True,
        )  # fmt: skip

        # The full model from the wheels just built, offline: siblings resolve by their plain names.
        python = _fresh_venv(session, tmp / "full-model-wheels")
        session.run(str(python), "-m", "pip", "install", "-q", CPU_TORCH, "triton", "numpy", external=True)
        session.run(
            str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist), "tritonformer-model",
            external=True,
        )  # fmt: skip
        session.run(str(python), "-c", f"{imports}; print('model and five kernels import from wheels')", external=True)


# A SwiGLU forward and backward through the installed package, compared with PyTorch.
ONE_KERNEL_CALL = """
import torch, torch.nn.functional as F, fused_swiglu
x = torch.randn(8, 16, requires_grad=True)
gate, up = torch.randn(16, 32, requires_grad=True), torch.randn(16, 32, requires_grad=True)
y = fused_swiglu.swiglu(x, gate, up)
torch.testing.assert_close(y, F.silu(x @ gate) * (x @ up), rtol=1e-4, atol=1e-4)
y.sum().backward()
print("fused_swiglu", fused_swiglu.__version__, "ran in the interpreter")
"""


def _import_names() -> list[str]:
    return [package.replace("-", "_") for package in KERNEL_PACKAGES] + ["tritonformer"]
