"""DataSciCoding: write a scikit-learn model-building function; the reward is its mean ROC-AUC.

After the POAD paper's DataSciCoding task (Wen et al., NeurIPS 2024, docs/envs.md): the agent sees a
tabular classification dataset (name, size, feature names, classes) and answers with Python code that
defines ``def build_model(X, y):`` returning a fitted classifier with ``predict_proba``. The env makes
`splits` seeded, stratified train/test splits (75% / 25%) and hands the training parts and the test
inputs to `agentrl.sandbox` (an OS sandbox, `sandbox="bwrap"`), where the code's model is fitted on
each training part and its ``predict_proba`` of the test inputs comes back. The test labels never leave
this process: the env scores the predictions itself, binary data with ``roc_auc_score`` of the positive
class, multiclass data with the one-vs-rest macro average. The reward is the mean over the splits, or
-1 on any error (the reason is ``info["reason"]``). Success: a score of at least `success_auc` (0.9).

The action is free text (`free_text_action`): `step` takes the code. An action *index* runs one of the
reference solutions named by `action_names` (logistic regression, a random forest, a constant
prior), so the classic agents have something meaningful to do (`agent=random` picks one per episode)
and an invalid LLM answer never runs one of them: the rollout passes its empty text instead.

With ``max_steps`` > 1 the episode continues after a failed or below-threshold attempt and the
observation shows the previous attempt's code and its score or error; it ends on success or after the
last attempt (termination: the attempt budget is part of the task). There is no numeric view (DQN
cannot run on free-text actions).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.envs.base import TEXT_CHARSET, TextEnv
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.sandbox import ALLOWED_MODULES, SandboxLimits, SandboxResult, require_sandbox, run_function

#: scikit-learn's bundled datasets (no download); `random` picks one per reset seed.
DATASETS: tuple[str, ...] = ("breast_cancer", "wine", "iris", "digits")
DATASET_CHOICES: tuple[str, ...] = (*DATASETS, "random")
FUNCTION = "build_model"
TEST_SIZE = 0.25
#: score of an attempt that failed in any way (and of an empty answer)
ERROR_REWARD = -1.0
_FEATURES_SHOWN = 12
_CODE_SHOWN = 3000

#: The reference solutions an action index runs (the classic agents' actions).
REFERENCE_SOLUTIONS: dict[str, str] = {
    "logistic_regression": (
        "from sklearn.linear_model import LogisticRegression\n"
        "from sklearn.pipeline import make_pipeline\n"
        "from sklearn.preprocessing import StandardScaler\n\n\n"
        "def build_model(X, y):\n"
        "    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))\n"
        "    return model.fit(X, y)\n"
    ),
    "random_forest": (
        "from sklearn.ensemble import RandomForestClassifier\n\n\n"
        "def build_model(X, y):\n"
        "    return RandomForestClassifier(n_estimators=50, random_state=0).fit(X, y)\n"
    ),
    "constant_prior": (
        "from sklearn.dummy import DummyClassifier\n\n\n"
        "def build_model(X, y):\n"
        "    return DummyClassifier(strategy='prior').fit(X, y)\n"
    ),
}


@functools.cache
def dataset_summary(name: str) -> dict[str, Any]:
    """Name, title, rows, feature names, class names and class counts of a bundled dataset."""
    x, y, feature_names, target_names, title = _load(name)
    counts = np.bincount(y, minlength=len(target_names))
    return {
        "name": name,
        "title": title,
        "rows": int(x.shape[0]),
        "features": [str(f) for f in feature_names],
        "classes": [str(t) for t in target_names],
        "class_counts": [int(c) for c in counts],
    }


@functools.cache
def _load(name: str) -> tuple[np.ndarray, np.ndarray, list[str], list[str], str]:
    from sklearn import datasets

    if name not in DATASETS:
        raise UnknownChoiceError("datascicoding dataset", name, DATASET_CHOICES)
    bunch = getattr(datasets, f"load_{name}")()
    title = next((line.strip() for line in bunch.DESCR.splitlines()[1:] if line.strip()), name)
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    return x, y, list(bunch.feature_names), [str(t) for t in bunch.target_names], title


# ---- the scoring (in the parent: the test labels never enter the sandbox) ---------------------------
@functools.lru_cache(maxsize=8)  # a few seeds (each holds a copy of the data); every reset draws a new one
def _splits(dataset: str, splits: int, seed: int) -> tuple[dict[str, np.ndarray], list[np.ndarray], int]:
    """The seeded stratified splits: the arrays the sandbox gets (training parts and test inputs), the
    test labels the parent keeps, and the number of classes."""
    from sklearn.model_selection import StratifiedShuffleSplit

    x, y, _, classes, _ = _load(dataset)
    splitter = StratifiedShuffleSplit(n_splits=splits, test_size=TEST_SIZE, random_state=seed)
    arrays, labels = {}, []
    for k, (train, test) in enumerate(splitter.split(x, y)):
        arrays.update({f"X_train_{k}": x[train], f"y_train_{k}": y[train], f"X_test_{k}": x[test]})
        labels.append(y[test])
    return arrays, labels, len(classes)


def score_predictions(
    result: SandboxResult, labels: list[np.ndarray], classes: int
) -> tuple[float | None, list[float], str]:
    """(mean ROC-AUC, split AUCs, "") from the sandbox's predictions, else (None, [], reason). The value
    comes from untrusted code: anything but a finite array of the expected shape is an error."""
    from sklearn.metrics import roc_auc_score

    if not result.ok:
        return None, [], result.reason
    proba, expected = result.value, (len(labels), len(labels[0]), classes)
    if not isinstance(proba, np.ndarray) or proba.shape != expected:
        got = proba.shape if isinstance(proba, np.ndarray) else type(proba).__name__
        return None, [], f"the sandbox returned {got} instead of predictions of shape {expected}"
    proba = proba.astype(np.float64)
    if not np.all(np.isfinite(proba)):
        return None, [], "predict_proba returned NaN or infinite values"
    aucs = []
    try:
        for y_test, p in zip(labels, proba, strict=True):
            if classes == 2:
                auc = roc_auc_score(y_test, p[:, 1])
            else:
                auc = roc_auc_score(y_test, p, multi_class="ovr", average="macro", labels=range(classes))
            aucs.append(float(auc))
    except ValueError as exc:  # multiclass scores that are not probabilities (rows not summing to 1)
        return None, [], _one_line(f"roc_auc_score refused the predictions: {exc}")
    return float(np.mean(aucs)), aucs, ""


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# ---- the environment ---------------------------------------------------------------------------------
class DataSciCodingEnv(TextEnv):
    """Write `build_model(X, y)` for a bundled scikit-learn dataset; reward = mean ROC-AUC or -1."""

    name = "datascicoding"
    free_text_action = True
    empty_answer_reward = ERROR_REWARD

    def __init__(
        self,
        dataset: str = "random",
        splits: int = 5,
        timeout_s: float = 30.0,
        memory_mb: int = 2048,
        max_steps: int = 1,
        success_auc: float = 0.9,
        sandbox: str = "bwrap",
        render_mode: str | None = None,
    ):
        if dataset not in DATASET_CHOICES:
            raise UnknownChoiceError("datascicoding dataset", dataset, DATASET_CHOICES)
        if int(splits) < 1:
            raise ConfigError(f"env datascicoding: splits must be at least 1, got {splits}")
        if float(timeout_s) <= 0:
            raise ConfigError(f"env datascicoding: timeout_s must be positive, got {timeout_s}")
        if int(memory_mb) < 256:
            raise ConfigError(f"env datascicoding: memory_mb must be at least 256, got {memory_mb}")
        if int(max_steps) < 1:
            raise ConfigError(f"env datascicoding: max_steps must be at least 1, got {max_steps}")
        require_sandbox(sandbox)  # no OS sandbox here: refused now, before any code runs
        self.sandbox = sandbox
        self.dataset_option = dataset
        self.splits = int(splits)
        self.limits = SandboxLimits(timeout_s=float(timeout_s), memory_mb=int(memory_mb))
        self.max_steps = int(max_steps)
        self.success_auc = float(success_auc)
        self.action_names = list(REFERENCE_SOLUTIONS)
        super().__init__(render_mode=render_mode)
        self.dataset = DATASETS[0] if dataset == "random" else dataset
        self.split_seed = 0
        self._clear()

    def _clear(self) -> None:
        self.attempts: list[dict[str, Any]] = []  # code, score (None on error), reason
        self.done = False
        #: the sandbox result of the last attempt (with its elapsed time, which info leaves out so that
        #: equal seeds and answers give equal infos)
        self.last_result: SandboxResult | None = None

    # ---- episode dynamics ----------------------------------------------------------------------
    def _reset(self, options: dict) -> None:
        if self.dataset_option == "random":
            self.dataset = DATASETS[int(self.np_random.integers(len(DATASETS)))]
        self.split_seed = int(self.np_random.integers(2**31 - 1))
        self._clear()

    def step(self, action: int | str | np.integer):
        """`action` is the submitted code (str), or the index of a reference solution."""
        if isinstance(action, str):
            code = action
        else:
            code = REFERENCE_SOLUTIONS[self.action_names[self.action_index(action)]]
        reward, terminated, success, extra = self._submit(code)
        self.steps_taken += 1
        info = self._info(success=success)
        info.update(extra)
        return self.render_text(), float(reward), bool(terminated), False, info

    def _step(self, index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        return self._submit(REFERENCE_SOLUTIONS[self.action_names[index]])

    def _submit(self, code: str) -> tuple[float, bool, bool, dict[str, Any]]:
        score, folds, reason = self._run(code)
        self.attempts.append({"code": code, "score": score, "reason": reason})
        success = score is not None and score >= self.success_auc
        self.done = success or len(self.attempts) >= self.max_steps
        reward = score if score is not None else ERROR_REWARD
        return reward, self.done, success, {"score": score, "fold_scores": folds, "reason": reason}

    def _run(self, code: str) -> tuple[float | None, list[float], str]:
        """Run the code on the training parts in the sandbox; score its test predictions here."""
        if not code.strip():
            self.last_result = SandboxResult(False, reason="no code was submitted")
            return None, [], self.last_result.reason
        arrays, labels, classes = _splits(self.dataset, self.splits, self.split_seed)
        self.last_result = run_function(
            code,
            FUNCTION,
            kwargs={"splits": self.splits, "classes": classes},
            arrays=arrays,
            harness="fit_predict_proba",
            limits=self.limits,
            seed=self.split_seed,
            mode=self.sandbox,
        )
        return score_predictions(self.last_result, labels, classes)

    def text_action_name(self, text: str) -> str:
        return f"code ({len(text)} chars)" if text.strip() else "no code"

    def _info(self, success: bool) -> dict[str, Any]:
        info = super()._info(success)
        scores = [a["score"] for a in self.attempts if a["score"] is not None]
        last_failed = bool(self.attempts) and self.attempts[-1]["score"] is None
        info["dataset"] = self.dataset
        info["episode_metrics"] = {
            "error_rate": float(last_failed),
            "best_auc": max(scores) if scores else 0.0,
        }
        return info

    # ---- text interface ------------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        allowed = ", ".join(sorted(ALLOWED_MODULES))
        attempts = "one attempt" if self.max_steps == 1 else f"up to {self.max_steps} attempts"
        return (
            "You are a data scientist. Write Python code that defines a function `def build_model(X, y):` "
            "for the classification dataset described below. X is a float numpy array (rows x features), "
            "y an integer numpy array of class labels 0..K-1. The function must return a fitted "
            "scikit-learn style classifier whose predict_proba(X) gives one column per class, in label "
            f"order. Your code is scored on {self.splits} stratified train/test splits "
            f"({100 - int(TEST_SIZE * 100)}% / {int(TEST_SIZE * 100)}%): build_model is called on each "
            "training part and predict_proba on its test part. The reward is the mean ROC-AUC (binary: "
            "AUC of class 1; multiclass: one-vs-rest macro average); any error gives -1. "
            f"Success: ROC-AUC >= {self.success_auc:g}. You have {attempts}. "
            f"Allowed imports: {allowed}. No file, network or process access; no eval, exec, open, "
            f"getattr or dunder attributes. Limits for all splits together: {self.limits.timeout_s:g} s, "
            f"{self.limits.memory_mb} MB of memory."
        )

    def render_text(self) -> str:
        info = dataset_summary(self.dataset)
        features = info["features"]
        if len(features) <= _FEATURES_SHOWN + 4:  # "... (2 more)" would save nothing
            shown = ", ".join(features)
        else:
            shown = ", ".join(features[:_FEATURES_SHOWN]) + f", ... ({len(features) - _FEATURES_SHOWN} more)"
        classes = ", ".join(
            f"{label} ({count} rows)" if name == str(label) else f"{label} = {name} ({count} rows)"
            for label, (name, count) in enumerate(zip(info["classes"], info["class_counts"], strict=True))
        )
        kind = "binary" if len(info["classes"]) == 2 else "multiclass"
        lines = [
            f"Dataset: {self.dataset} ({info['title']}), {kind} classification.",
            f"{info['rows']} rows, {len(features)} numeric features, {len(info['classes'])} classes.",
            f"Features: {shown}",
            f"Classes (y): {classes}",
        ]
        if self.attempts:
            last = self.attempts[-1]
            code = last["code"] if len(last["code"]) <= _CODE_SHOWN else last["code"][:_CODE_SHOWN] + "\n..."
            lines += ["", f"Your previous attempt ({len(self.attempts)} of {self.max_steps}):", code.rstrip()]
            if last["score"] is None:
                lines.append(f"It failed (reward -1): {last['reason']}")
            else:
                lines.append(f"It scored ROC-AUC {last['score']:.4f} (success at {self.success_auc:g}).")
        if not self.done:
            lines += ["", f"Attempt {len(self.attempts) + 1} of {self.max_steps}: define build_model(X, y)."]
        return _printable("\n".join(lines))

    def state(self) -> dict[str, Any]:
        last = self.attempts[-1] if self.attempts else {}
        return {
            "dataset": self.dataset,
            "split_seed": self.split_seed,
            "attempt": len(self.attempts),
            "max_steps": self.max_steps,
            "last_score": last.get("score"),
            "last_reason": last.get("reason", ""),
        }

    # ---- numeric view -------------------------------------------------------------------------
    def numeric_space(self) -> gym.spaces.Box:
        raise ConfigError("datascicoding has no numeric view; DQN cannot run on it (its actions are code)")

    def numeric_observation(self) -> np.ndarray:
        raise ConfigError("datascicoding has no numeric view; DQN cannot run on it (its actions are code)")


def _printable(text: str, limit: int = 8000) -> str:
    """Observation text within the Text space: printable ASCII and newlines, at most `limit` chars."""
    clean = "".join(c if c in TEXT_CHARSET else ("    " if c == "\t" else "?") for c in text)
    return clean if len(clean) <= limit else clean[: limit - 4] + "\n..."
