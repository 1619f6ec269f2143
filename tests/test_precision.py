"""`algo.precision=auto` on a CPU (agentrl/kernels/precision.py): the bf16 matrix instructions come from cpuinfo,
never assumed; bf16-mixed is chosen only where they exist and bf16 wins at the model's shapes."""

from __future__ import annotations

import pytest

import agentrl.kernels.features as features
import agentrl.kernels.precision as precision
import agentrl.models as models
from agentrl.kernels.precision import bf16_instructions, cpu_auto_precision, cpu_flags, describe_cpu
from agentrl.trainers.settings import resolve_precision


@pytest.fixture
def auto_features(monkeypatch):
    """The probes answer for the CPU a test describes, whatever AGENTRL_CPU_FEATURES the suite runs under."""
    monkeypatch.delenv(features.ENV, raising=False)


SAPPHIRE_RAPIDS = "fpu vme avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
COOPER_LAKE = "fpu vme avx2 avx512f avx512_bf16"  # AVX512-BF16, no AMX (the development machine)
SKYLAKE = "fpu vme avx2 avx512f avx512bw"


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test cpu\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    return path


@pytest.mark.parametrize(
    ("flags", "found", "words"),
    [
        (SAPPHIRE_RAPIDS, ("avx512_bf16", "amx_bf16", "amx_tile"), "avx512_bf16, amx_bf16 (AMX)"),
        (COOPER_LAKE, ("avx512_bf16",), "avx512_bf16 (no AMX)"),
        (SKYLAKE, (), "neither avx512_bf16 nor amx_bf16;"),
        ("amx_bf16", (), "neither avx512_bf16 nor amx_bf16;"),  # AMX-BF16 without the tile unit cannot run
    ],
)
def test_the_bf16_instructions_come_from_cpuinfo(tmp_path, flags, found, words, auto_features):
    read = cpu_flags(_cpuinfo(tmp_path, flags))
    assert bf16_instructions(read) == found
    assert describe_cpu(read).startswith(words)
    assert "torch CPU capability" in describe_cpu(read)


def test_no_cpuinfo_means_no_instructions(tmp_path):
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu_auto_precision((576, 1536), tmp_path / "missing")[0] == "fp32"


def test_auto_is_bf16_mixed_only_with_the_instructions_and_a_measured_win(
    tmp_path, monkeypatch, auto_features
):
    speedups: list[tuple[int, int]] = []

    def timed(speedup):
        def probe(hidden, intermediate, threads):
            speedups.append((hidden, intermediate))
            return speedup

        return probe

    monkeypatch.setattr(precision, "autocast_speedup", timed(2.0))
    assert cpu_auto_precision((576, 1536), _cpuinfo(tmp_path, SKYLAKE))[0] == "fp32"
    assert speedups == []  # no instructions: nothing to time
    choice, reason = cpu_auto_precision((576, 1536), _cpuinfo(tmp_path, COOPER_LAKE))
    assert choice == "bf16-mixed" and "2.00x" in reason and speedups == [(576, 1536)]
    assert cpu_auto_precision((64, 128), _cpuinfo(tmp_path, COOPER_LAKE))[0] == "fp32"  # too small
    assert cpu_auto_precision(None, _cpuinfo(tmp_path, COOPER_LAKE))[0] == "fp32"
    monkeypatch.setattr(precision, "autocast_speedup", timed(1.1))
    assert cpu_auto_precision((576, 1536), _cpuinfo(tmp_path, SAPPHIRE_RAPIDS))[0] == "fp32"  # no win


def test_resolve_precision():
    assert resolve_precision("fp32", "cuda") == "fp32"
    assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    assert resolve_precision("auto", "cuda:0") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") == "fp32"  # no model shapes: the launcher's view
    assert resolve_precision("auto", "cpu", (64, 128)) == "fp32"  # the tiny model, on any CPU


def test_the_dry_run_says_what_auto_depends_on(monkeypatch, auto_features):
    """A dry run times nothing, so on a CPU it names what `auto` will be decided by at launch, never a
    bare "fp32" that the launch then contradicts."""
    from agentrl.runs.plan import _shown_precision

    monkeypatch.setattr(models, "model_shapes", lambda model_cfg: (576, 1536))
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    shown = _shown_precision("auto", False, 1, None)
    assert shown.startswith("auto: bf16-mixed if bf16 autocast times >= 1.3x") and "avx512_bf16" in shown
    assert _shown_precision("auto", False, 2, None) == "auto = fp32 (several processes)"
    assert _shown_precision("auto", True, 1, None) == "auto = bf16-mixed"
    assert _shown_precision("fp32", False, 1, None) == "fp32"
    monkeypatch.setattr(models, "model_shapes", lambda model_cfg: (64, 128))
    assert _shown_precision("auto", False, 1, None) == "auto = fp32 (hidden size 64 < 256)"
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f"}))
    assert _shown_precision("auto", False, 1, None) == "auto = fp32 (the CPU has no bf16 matrix instructions)"


def test_plain_answers_as_a_cpu_without_bf16_instructions(tmp_path, monkeypatch):
    """AGENTRL_CPU_FEATURES=plain: on a CPU with AMX-BF16 `auto` is fp32 without timing anything, and the
    log line names what was detected and what was forced; the dry run says the same."""
    from agentrl.runs.plan import _shown_precision

    speedups: list[int] = []
    monkeypatch.setattr(precision, "autocast_speedup", lambda *a: speedups.append(1) or 2.0)
    monkeypatch.setenv(features.ENV, "plain")
    read = cpu_flags(_cpuinfo(tmp_path, SAPPHIRE_RAPIDS))
    assert bf16_instructions(read) == ("avx512_bf16", "amx_bf16", "amx_tile")  # detected
    assert precision.usable_bf16_instructions(read) == ()  # what the probes use
    choice, reason = cpu_auto_precision((576, 1536), _cpuinfo(tmp_path, SAPPHIRE_RAPIDS))
    assert choice == "fp32" and "AGENTRL_CPU_FEATURES=plain" in reason and speedups == []
    line = describe_cpu(read)
    assert line.startswith("avx512_bf16, amx_bf16 (AMX); forced by AGENTRL_CPU_FEATURES=plain")
    assert "oneDNN bf16" in line and "torch CPU capability" in line
    monkeypatch.setattr(models, "model_shapes", lambda model_cfg: (576, 1536))
    monkeypatch.setattr(precision, "cpu_flags", lambda *a: read)
    assert _shown_precision("auto", False, 1, None) == (
        "auto = fp32 (no bf16 matrix instructions under AGENTRL_CPU_FEATURES=plain)"
    )
    monkeypatch.setenv(features.ENV, "auto")
    assert cpu_auto_precision((576, 1536), _cpuinfo(tmp_path, SAPPHIRE_RAPIDS))[0] == "bf16-mixed"
