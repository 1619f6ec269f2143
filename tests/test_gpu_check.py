"""benchmarks/gpu_check.py on the CPU: its pieces (peak table, MFU, the weight comparison), and the whole
check end to end with `--tiny --device cpu` (a 2-layer Qwen2 model, full fine-tuning then LoRA)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _load()


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("Tesla T4", None),
    ],
)
def test_peak_bf16_table(name, tflops):
    assert gpu_check.peak_tflops(name) == tflops


def test_mfu_is_executed_flops_over_peak():
    # 6e12 FLOPs in 1 s on a 60 TFLOP/s peak: 10%
    assert gpu_check.mfu(6e12, 1.0, 60.0) == pytest.approx(0.1)
    assert gpu_check.mfu(6e12, 1.0, None) is None


def test_changed_fraction_counts_differing_elements():
    before = torch.zeros(10)
    after = before.clone()
    after[:3] = 1e-6
    assert gpu_check.changed_fraction(before, after) == pytest.approx(0.3)
    with pytest.raises(gpu_check.CheckFailed):
        gpu_check.changed_fraction(before, torch.zeros(5))


def test_iterations_below_two_are_refused():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--iterations", "1"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_says_so_and_exits_2(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_tiny_cpu_suite_end_to_end(tmp_path, capsys):
    """`--suite` on the CPU: full fine-tuning, LoRA with a KL term, the critic (POAD), the rollout copy;
    the several-GPU and vLLM checks skipped with their reasons. MFU counts the FLOPs the update executed
    (agentrl/kernels/flops.py), not 6 x parameters x tokens."""
    from agentrl.kernels.flops import Shape, update_flops

    out = tmp_path / "gpu_check.json"
    argv = ["--suite", "--tiny", "--device", "cpu", "--out", str(out), "--peak-tflops", "0.05"]
    code = gpu_check.main(argv)
    printed = capsys.readouterr().out
    assert code == 0, printed
    summary = json.loads(out.read_text())
    assert summary["passed"] and summary["failures"] == []
    assert summary["model"]["num_hidden_layers"] == 2
    runs, checks = summary["runs"], summary["checks"]
    assert list(checks) == ["full", "lora_kl", "vllm_colocate", "critic", "rollout_copy", "multi_gpu"]
    assert checks["multi_gpu"] == {"status": "skipped", "passed": None, "reason": "no CUDA device"}
    assert checks["vllm_colocate"]["status"] == "skipped" and "CUDA" in checks["vllm_colocate"]["reason"]
    full, lora = runs["full"], runs["lora_kl"]

    assert full["precision"] == "fp32" and full["trainable_dtype"] == ["float32"]  # auto on the CPU
    assert full["weights_moved"]["ok"] and full["weights_moved"]["min"] > 0.9
    assert full["trainable_parameters"] == full["parameters"]

    assert lora["lora_r"] == 16 and 0 < lora["trainable_parameters"] < lora["parameters"]
    assert lora["overrides"] == ["algo.beta=0.04"]
    assert lora["weights_moved"]["ok"] and lora["weights_moved"]["min"] > 0.9  # every lora_B tensor
    assert lora["weights_moved"]["lora_A_overall"] > 0  # the second update reached A through B
    assert lora["frozen_unchanged"] and all(v == 0 for v in lora["frozen_unchanged"].values())
    assert runs["critic"]["overrides"][0] == "algo=poad" and runs["rollout_copy"]["passed"]

    for run in (full, lora, runs["critic"], runs["rollout_copy"]):
        assert [r["iteration"] for r in run["iterations"]] == [1, 2]
        assert run["rollout_tokens_per_s"] > 0 and run["update_tokens_per_s"] > 0
        assert run["peak_gpu_memory_gib"] is None  # CPU
        last = run["iterations"][-1]
        assert run["mfu"] == pytest.approx(last["update_flops"] / last["update_s"] / 0.05e12)
        assert "shared-prefix kernel" in run["mfu_flops"]  # the CPU's log-prob path
    # the executed FLOPs are far below the old 6 x parameters x (prompt + completion) tokens estimate
    last = full["iterations"][-1]
    assert last["update_flops"] < 0.5 * 6 * full["parameters"] * last["train_tokens"]
    assert update_flops(Shape(1, 8, 2, 2, 4, 16, 10), [([1, 2], 2)], shared_prefix=True) > 0
    assert "gpu_check PASSED" in printed and "SKIPPED: no CUDA device" in printed


def test_the_suite_skips_what_the_time_budget_cannot_fit(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--suite", "--tiny", "--device", "cpu", "--out", str(out), "--budget-s", "0"]) == 0
    checks = json.loads(out.read_text())["checks"]
    assert checks["full"]["status"] == "ran"  # the first check always runs (nothing measured yet)
    assert checks["lora_kl"]["status"] == "skipped" and "time budget" in checks["lora_kl"]["reason"]


def test_weights_that_cannot_move_fail_the_check(tmp_path, capsys):
    """A learning rate far below fp32's resolution: the update rounds away, and the check says so."""
    out = tmp_path / "gpu_check.json"
    argv = ["--tiny", "--device", "cpu", "--out", str(out), "--runs", "full", "algo.learning_rate=1e-30"]
    assert gpu_check.main(argv) == 1
    err = capsys.readouterr().err
    assert "gpu_check FAILED: full: weights did not move" in err
    summary = json.loads(out.read_text())
    assert not summary["passed"] and not summary["runs"]["full"]["weights_moved"]["ok"]


def test_vllm_logits_check_catches_a_sync_that_carries_nothing(monkeypatch):
    """The suite's vLLM check with a fake engine: it passes when the sync carries the weights, and fails
    when it does not."""
    import copy
    import sys
    from types import SimpleNamespace

    from agentrl.models import apply_lora, load_model, model_config

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=dict))
    base, _ = load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")
    model = apply_lora(base, model_config({"name": "t", "name_or_path": "x", "lora": {"r": 4}}).lora).eval()

    class Engine:
        def __init__(self):
            self.weights = copy.deepcopy(model)

        def generate(self, prompts, sampling_params, use_tqdm):
            with torch.no_grad():
                logits = self.weights(input_ids=torch.tensor([prompts[0]["prompt_token_ids"]])).logits[0, -1]
            logps = torch.log_softmax(logits.float(), -1)
            top = logps.topk(sampling_params["logprobs"])
            entries = {
                int(t): SimpleNamespace(logprob=float(v))
                for v, t in zip(top.values, top.indices, strict=True)
            }
            return [SimpleNamespace(outputs=[SimpleNamespace(logprobs=[entries])])]

    for carries, ok in ((True, True), (False, False)):
        engine = Engine()

        def sync(engine=engine, carries=carries):
            if carries:
                engine.weights = copy.deepcopy(model)

        trainer = SimpleNamespace(
            rollout_backend=SimpleNamespace(generation=SimpleNamespace(llm=engine), sync_weights=sync)
        )
        result = gpu_check.vllm_logits_check(model, trainer)
        assert (result["failures"] == []) is ok, result
