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
    assert lora["overrides"] == ["algo.beta=0.04", "algo.learning_rate=1e-3"]
    assert lora["extra_check"]["kl"][-1] > 0 and lora["extra_check"]["reference_policy_max_logp_gap"] > 0
    assert all(f > 0 for f in runs["critic"]["extra_check"]["value_head_changed"].values())
    assert runs["rollout_copy"]["extra_check"]["copy_generated_tokens"] > 0
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


def test_profile_runs_one_more_update_under_the_profiler_and_keeps_the_figures_of_the_one_before(
    tmp_path, capsys
):
    out = tmp_path / "gpu_check.json"
    argv = [
        "--tiny",
        "--device",
        "cpu",
        "--runs",
        "full",
        "--profile",
        "--out",
        str(out),
        "--peak-tflops",
        "0.05",
    ]
    assert gpu_check.main(argv) == 0
    printed = capsys.readouterr().out
    full = json.loads(out.read_text())["runs"]["full"]
    assert [(r["iteration"], r["profiled"]) for r in full["iterations"]] == [
        (1, False),
        (2, False),
        (3, True),
    ]
    second = full["iterations"][1]
    assert full["update_tokens_per_s"] == second["update_tokens_per_s"] and full["mfu"] == second["mfu"]
    prof = full["update_profile"]
    assert prof["iteration"] == 3 and prof["device_busy_share"] is None  # the CPU: no device to be busy
    assert 0 < prof["timed_s"] and 0 < prof["window_s"] < full["iterations"][2]["update_s"] + 1
    assert "matmul" in prof["categories"] and any(op["name"] == "aten::mm" for op in prof["top"])
    assert sum(c["share"] for c in prof["categories"].values()) == pytest.approx(1.0)
    assert "iteration 3's update profiled" in printed


def test_the_update_profile_sums_kernel_time_against_the_window_on_cuda():
    """On a GPU the profile counts the kernels' device time (not the host operators that launched them)
    and its share of the window: the rest is time the GPU waited for the host."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(key, seconds, device):
        us = seconds * 1e6
        return SimpleNamespace(
            key=key, count=2, device_type=device, self_device_time_total=us, self_cpu_time_total=us
        )

    events = [
        event("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 0.6, DeviceType.CUDA),
        event(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
            0.1,
            DeviceType.CUDA,
        ),
        event(
            "void multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>",
            0.05,
            DeviceType.CUDA,
        ),
        event("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 0.05, DeviceType.CUDA),
        event("aten::mm", 0.6, DeviceType.CPU),  # the host op of the gemm: not counted twice
    ]
    summary = gpu_check.summarize_profile(events, window_s=1.0, cuda=True)
    assert summary["timed_s"] == pytest.approx(0.8) and summary["device_busy_share"] == pytest.approx(0.8)
    shares = {cat: c["share"] for cat, c in summary["categories"].items()}
    assert shares == pytest.approx(
        {"matmul": 0.75, "elementwise": 0.125, "optimizer": 0.0625, "attention": 0.0625}
    )
    assert [op["category"] for op in summary["top"]] == ["matmul", "elementwise", "optimizer", "attention"]
    assert gpu_check.profile_category("void at::native::cunn_SoftMaxForward<8, float>") == "softmax"
    assert gpu_check.profile_category("Memcpy DtoD (Device -> Device)") == "copies and casts"


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


def _one_check(tmp_path, name: str) -> dict:
    """The suite's check `name` alone on the tiny CPU model, with its own assertions (`suite_probe`)."""
    args = gpu_check.parse_args(["--tiny", "--device", "cpu", "--out", str(tmp_path / "x.json")])
    model_dir = tmp_path / "model"
    gpu_check.build_model(model_dir, "tiny", "cpu")
    mode, extra = {n: (m, e) for n, m, e in gpu_check.SUITE_RUNS}[name]
    probe = gpu_check.suite_probe(name)
    return gpu_check.run_one(mode, model_dir, tmp_path, args, None, name=name, extra=extra, probe=probe)


def _break(monkeypatch, name: str) -> str:
    """Break the feature the suite's check `name` is about; returns the failure its probe must report."""
    from agentrl.trainers import grpo_trainer, multistep

    if name == "lora_kl":  # the loss reads the policy's own log-probs as the reference
        monkeypatch.setattr(
            grpo_trainer.MultiStepTrainer,
            "_reference_logps",
            lambda self, batch, rows: self._rollout_logps(batch),
        )
        return "the reference is the policy"
    if name == "critic":  # the value head's optimizer never steps
        monkeypatch.setattr(grpo_trainer, "step_value_head", lambda *args: None)
        return "value head"
    # rollout_copy: the trained model generates, the copy is never used
    monkeypatch.setattr(multistep, "_rollout_agent", lambda trainer, agent, algo, loaded: agent)
    return "the bf16 copy generated 0 tokens"


@pytest.mark.parametrize("name", ["lora_kl", "critic", "rollout_copy"])
def test_a_suite_check_fails_when_its_feature_is_broken(tmp_path, monkeypatch, name):
    """Each of these checks asserts its own feature, not only that the model's weights moved: with the
    feature broken (the weights still move) its probe reports it."""
    expected = _break(monkeypatch, name)
    run = _one_check(tmp_path, name)
    assert run["weights_moved"]["ok"]  # what the weight snapshot alone would have passed
    assert not run["passed"] and any(expected in f for f in run["failures"]), run["failures"]


def test_the_vllm_check_fails_on_rows_its_importance_ratio_masks(monkeypatch):
    """vLLM colocate runs with the paper presets' top-k: rows that the importance ratio zeroes (the
    trainer's kept set missing a token vLLM sampled) fail it."""
    monkeypatch.setattr(gpu_check, "vllm_logits_check", lambda model, trainer: {"failures": []})
    probe = gpu_check.VLLMProbe()
    failures = probe.check(None, None, [{"sampling/masked_rows": 0}, {"sampling/masked_rows": 5}])["failures"]
    assert "rows masked by the importance ratio per iteration: [0, 5]" in failures[0]
    assert probe.check(None, None, [{"sampling/masked_rows": 0}])["failures"] == []


def test_the_several_process_check_fails_on_a_run_that_trains_nothing(tmp_path, monkeypatch):
    """`multi_gpu`: a launch that exits 0 with a complete status but no metrics row (what three or more
    processes did when TRL's sampler had no batch for them) fails; a run with every row passes."""
    import subprocess

    args = gpu_check.parse_args(["--tiny", "--device", "cpu"])

    def fake(rows: int):
        def run(cmd, **kwargs):
            run_dir = Path(next(c for c in cmd if c.startswith("hydra.run.dir=")).split("=", 1)[1])
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "status.json").write_text(json.dumps({"status": "complete"}))
            lines = [json.dumps({"iteration": k + 1, "grad_norm": 0.5}) for k in range(rows)]
            (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
            return subprocess.CompletedProcess(cmd, 0, "", "")

        return run

    monkeypatch.setattr(subprocess, "run", fake(0))
    result = gpu_check.multi_process_check(tmp_path / "model", tmp_path, args, 3)
    assert "0 metrics rows for 2 iterations" in result["failures"][0]
    assert "distributed.num_processes=3" in result["command"]
    monkeypatch.setattr(subprocess, "run", fake(2))
    assert gpu_check.multi_process_check(tmp_path / "model", tmp_path, args, 3)["passed"]


@pytest.mark.multiprocess
def test_the_several_process_check_trains_three_cpu_processes(tmp_path):
    """`multi_gpu`'s launch for real, on three gloo processes (torchrun without CUDA)."""
    args = gpu_check.parse_args(["--tiny", "--device", "cpu"])
    gpu_check.build_model(tmp_path / "model", "tiny", "cpu")
    result = gpu_check.multi_process_check(tmp_path / "model", tmp_path, args, 3)
    assert result["passed"], result["failures"]
    assert [r["iteration"] for r in result["metrics_rows"]] == [1, 2]


def test_all_reads_pytests_report_and_the_before_budgets_are_restored(tmp_path, monkeypatch):
    """`--all`: the pytest run's counts and failures come from its JUnit XML (a failing test fails the
    command); the comparison's budgets planned from the free memory alone are put back afterwards."""
    import subprocess

    from agentrl.trainers import grpo_trainer, settings

    args = gpu_check.parse_args(["--all", "--tiny", "--device", "cpu", "--pytest-args", "tests/x.py -k y"])
    assert args.suite and args.budget_s == gpu_check.ALL_SUITE_BUDGET_S
    xml = """<testsuites><testsuite tests="5" failures="1" errors="0" skipped="1">
      <testcase classname="tests.test_a" name="test_ok"/>
      <testcase classname="tests.test_a" name="test_bad"><failure message="assert 1 == 2">...</failure></testcase>
    </testsuite></testsuites>"""

    def fake(cmd, **kwargs):
        assert kwargs["env"]["AGENTRL_TEST_CUDA"] == "1" and cmd[-3:] == ["tests/x.py", "-k", "y"]
        Path(next(c for c in cmd if c.startswith("--junitxml=")).split("=", 1)[1]).write_text(xml)
        return subprocess.CompletedProcess(cmd, 1, "", "")

    monkeypatch.setattr(subprocess, "run", fake)
    result = gpu_check.run_pytest(args, 100.0, tmp_path)
    assert (result["passed"], result["failed"], result["skipped"], len(result["failures"])) == (3, 1, 1, 1)
    assert result["failed_tests"] == ["tests.test_a::test_bad: failure: assert 1 == 2"]
    pending, scale = grpo_trainer.pending_training_state_bytes, settings.PADDED_ACTIVATION_SCALE
    with gpu_check.budgets_from_free_memory_at_build():
        assert grpo_trainer.pending_training_state_bytes(None) == 0 and settings.PADDED_ACTIVATION_SCALE == 1
    assert grpo_trainer.pending_training_state_bytes is pending and settings.PADDED_ACTIVATION_SCALE == scale


@pytest.mark.slow  # three tiny training runs and a pytest subprocess (~1 min on 2 cores)
def test_all_writes_the_3b_figures_the_suite_and_pytest_in_one_json(tmp_path):
    out = tmp_path / "all.json"
    argv = ["--all", "--tiny", "--device", "cpu", "--out", str(out), "--budget-s", "0"]
    code = gpu_check.main([*argv, "--pytest-args", "tests/test_gpu_check.py -k peak_bf16_table"])
    summary = json.loads(out.read_text())
    assert code == 0, summary["failures"]
    large = summary["large"]
    assert large["full"]["passed"] and large["full_budgets_at_build"]["passed"]
    assert set(large["comparison"]) == {"full", "full_budgets_at_build", "size"}
    assert large["full"]["update_profile"]["top"] and large["full_budgets_at_build"]["update_profile"] is None
    assert summary["checks"]["full"]["status"] == "ran"
    assert summary["pytest"]["passed"] == 7 and summary["pytest"]["failures"] == []
