"""Chapter 02's checks: correct answers in any style pass; each typical mistake is named.

Answers run as they would in the notebook: after the chapter's settings cell, in a module of
their own.
"""

import json
import sys
import types

import numpy as np
import pytest

from forge_course.grader import codec
from forge_course.grader.assignment import INSTALL_TAG
from forge_course.grading import Mistake, ch02
from forge_course.release import source_notebook
from tests.answers import ch02 as answers
from tests.conftest import REPO

CHAPTER = REPO / "solutions" / "ch02_datasets_dataloaders.py"
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
CSV_IDS = [wrong.__name__ for _, wrong in ch02.CSV_DATASET_MISTAKES]
INIT_IDS = [wrong.__name__ for _, wrong in ch02.WORKER_INIT_MISTAKES]


@pytest.fixture(scope="module")
def cells():
    """The settings cell and every solution cell of the chapter, by grade id."""
    nb = source_notebook(CHAPTER)
    code = [c for c in nb.cells if c.cell_type == "code"]
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in code
                 if c.metadata.get("nbgrader", {}).get("solution")}  # fmt: skip
    plain = [c for c in code if "nbgrader" not in c.metadata]
    settings = next(c.source for c in plain if INSTALL_TAG not in c.metadata.get("tags", []))
    return settings, solutions


def run_answer(cells, source, name):
    """Run the settings cell, then ``source``, in a fresh importable module; return ``name``."""
    prelude, _ = cells
    module = types.ModuleType(f"ch02_answer_{abs(hash(source))}")
    sys.modules[module.__name__] = module
    exec(compile(prelude + "\n" + source, module.__name__, "exec"), module.__dict__)
    return module.__dict__[name]


def test_every_exercise_has_a_solution_cell_defining_its_function(cells):
    _, solutions = cells
    for exercise in ch02.EXERCISES:
        assert f"{exercise.function}" in solutions[exercise.grade_id]


# ---------------------------------------------------------------- ch02_csv_dataset


def test_csv_dataset_accepts_the_solution_and_the_alternative(cells):
    _, solutions = cells
    for source in (solutions["ch02_csv_dataset"], answers.CSV_REREADS_EACH_ITEM):
        ch02.check_csv_dataset(run_answer(cells, source, "ReviewsDataset"), thorough=True)


LIST_STYLE = """
class ReviewsDataset(Dataset):
    def __init__(self, path, vocabulary):
        self.vocabulary = vocabulary
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            next(reader)  # the header
            self.rows = [[text, int(label)] for text, label in reader]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        text, label = self.rows[index]
        return [encode(text, self.vocabulary), torch.tensor(label, dtype=torch.int64)]
"""


def test_csv_dataset_accepts_a_list_for_a_pair_and_a_plain_reader(cells):
    ch02.check_csv_dataset(run_answer(cells, LIST_STYLE, "ReviewsDataset"), thorough=True)


@pytest.mark.parametrize(
    "message,wrong",
    ch02.CSV_DATASET_MISTAKES,
    ids=[w.__name__ for _, w in ch02.CSV_DATASET_MISTAKES],
)
def test_csv_dataset_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch02.check_csv_dataset(wrong, thorough=True)
    assert message in str(caught.value)


@pytest.mark.parametrize("wrong", [w for _, w in ch02.CSV_DATASET_MISTAKES], ids=CSV_IDS)
def test_known_wrong_datasets_never_crash_on_a_case(wrong):
    # A crash while matching known mistakes would reach the learner as a confusing message.
    for case in ch02.csv_dataset_cases(thorough=True):
        ch02.observe_csv_dataset(wrong, case)


@pytest.mark.parametrize(
    "source,phrase",
    [(source, said["ch02_csv_dataset_tests"]) for source, said in answers.WRONG["ch02_csv_dataset"]]
    + [
        (LIST_STYLE.replace("next(reader)  # the header", "pass"), "the header `text,label`"),
        (LIST_STYLE.replace("text, label = self.rows[index]",
                            "if not 0 <= index < len(self):\n            raise IndexError(index)\n"
                            "        text, label = self.rows[index]"),
         "negative indices count from the end"),
        (LIST_STYLE.replace("encode(text, self.vocabulary)",
                            "torch.tensor([self.vocabulary[w] for w in tokenize(text)])"),
         "a word missing from the vocabulary"),
        (LIST_STYLE.replace("text, label in reader]", "text, label in (l.split(',') for l in f)]"),
         "inside quotes"),
        (LIST_STYLE.replace("return len(self.rows)", "return len(self.rows) + 1"),
         "the header `text,label` (or an empty line at the end of the file) is not a review"),
        (LIST_STYLE.replace("return len(self.rows)", "return len(self.rows) + 2"),
         "len(dataset) should be 164, the number of reviews in the file, but it is 166"),
    ],
)  # fmt: skip
def test_csv_dataset_explains_wrong_answers(cells, source, phrase):
    with pytest.raises(Mistake) as caught:
        ch02.check_csv_dataset(run_answer(cells, source, "ReviewsDataset"), thorough=True)
    assert phrase in str(caught.value)


def test_csv_dataset_unanswered_says_not_written(cells):
    blank = "class ReviewsDataset(Dataset):\n    def __init__(self, path, vocabulary):\n" \
            "        raise NotImplementedError()\n"  # fmt: skip
    with pytest.raises(Mistake, match="not written yet"):
        ch02.check_csv_dataset(run_answer(cells, blank, "ReviewsDataset"))


def test_csv_dataset_refuses_the_reference_itself_or_a_subclass(cells):
    for source in (answers.REFERENCE_CALLER["ch02_csv_dataset"],
                   answers.REFERENCE_CALLER["ch02_csv_dataset"]
                   + "\nclass ReviewsDataset(ReviewsDataset):\n    pass\n"):  # fmt: skip
        with pytest.raises(Mistake, match="calls forge_course's reference"):
            ch02.check_csv_dataset(run_answer(cells, source, "ReviewsDataset"))


# ---------------------------------------------------------------- ch02_worker_init

SEED_SEQUENCE_STYLE = """
def worker_init_fn(worker_id):
    info = get_worker_info()
    streams = np.random.SeedSequence(info.seed).spawn(2)
    info.dataset.np_rng = np.random.Generator(np.random.PCG64(streams[0]))
    info.dataset.py_rng = random.Random(int(streams[1].generate_state(1)[0]))
"""


def test_worker_init_accepts_correct_answers_in_any_style(cells):
    _, solutions = cells
    for source in (solutions["ch02_worker_init"], answers.INIT_INITIAL_SEED, SEED_SEQUENCE_STYLE):
        ch02.check_worker_init(run_answer(cells, source, "worker_init_fn"), thorough=True)


@pytest.mark.parametrize(
    "message,wrong",
    ch02.WORKER_INIT_MISTAKES,
    ids=[w.__name__ for _, w in ch02.WORKER_INIT_MISTAKES],
)
def test_worker_init_names_each_known_mistake(message, wrong):
    with pytest.raises(Mistake) as caught:
        ch02.check_worker_init(wrong)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "source,phrase",
    [(source, said["ch02_worker_init_tests"]) for source, said in answers.WRONG["ch02_worker_init"]]
    + [
        ("def worker_init_fn():\n    pass\n", "raised TypeError"),
        ("def worker_init_fn(worker_id):\n    raise NotImplementedError()\n", "not written yet"),
        ("worker_init_fn = 42\n", "should be a function"),
        ("def worker_init_fn(worker_id):\n    get_worker_info().dataset.np_rng = None\n",
         "then raised AttributeError"),
        (answers.REFERENCE_CALLER["ch02_worker_init"], "calls forge_course's reference"),
    ],
)  # fmt: skip
def test_worker_init_explains_wrong_answers(cells, source, phrase):
    with pytest.raises(Mistake) as caught:
        ch02.check_worker_init(run_answer(cells, source, "worker_init_fn"))
    assert phrase in str(caught.value)


# Each worker's own stream must follow the loader's generator: pooling every worker's draws let
# one worker that kept its copied generators pass, as long as another worker changed.
SKIPS_WORKER_ZERO = """
def worker_init_fn(worker_id):
    if worker_id == 0:
        return
    info = get_worker_info()
    info.dataset.np_rng = np.random.default_rng(info.seed)
    info.dataset.py_rng = random.Random(info.seed)
"""
FIXED_SEED_FOR_WORKER_ZERO = """
def worker_init_fn(worker_id):
    info = get_worker_info()
    seed = 12345 if worker_id == 0 else info.seed
    info.dataset.np_rng = np.random.default_rng(seed)
    info.dataset.py_rng = random.Random(seed)
"""


@pytest.mark.parametrize(
    "source,phrase",
    [(SKIPS_WORKER_ZERO, "worker 0 keeps the generators it was copied with"),
     (FIXED_SEED_FOR_WORKER_ZERO, "should be 'none', but it is 'worker 0'")],
)  # fmt: skip
def test_worker_init_checks_every_worker_own_stream(cells, source, phrase):
    with pytest.raises(Mistake) as caught:
        ch02.check_worker_init(run_answer(cells, source, "worker_init_fn"))
    assert phrase in str(caught.value)


def test_hidden_cases_also_compare_epochs_and_use_three_workers():
    cases = ch02.worker_init_cases(thorough=True)
    assert {c["num_workers"] for c in cases} == {2, 3}
    verdict = ch02.observe_worker_init(ch02.WORKER_INIT.reference, cases[0])
    assert verdict["workers whose NumPy draws repeat in the next epoch"] == "none"
    assert verdict["workers whose Python draws repeat in the next epoch"] == "none"


# ---------------------------------------------------------------- questions


def test_questions_accept_numbers_computed_with_numpy():
    nb = source_notebook(CHAPTER)
    ids = {c.metadata.get("nbgrader", {}).get("grade_id", ""): c.source for c in nb.cells}
    tests = [source for grade_id, source in ids.items() if grade_id.startswith("ch02_q_")]
    assert len(tests) == 3
    for unseen, batches in [(np.int64(4), np.float32(4.0)), (np.float32(4.0), np.int32(4))]:
        scope = {"unseen_examples": unseen, "worker0_batches": batches, "workers_answer": "b"}
        for source in tests:  # hidden tests included: they are comments to nbgrader's marks
            exec(compile(source, "<question test>", "exec"), dict(scope))
    with pytest.raises(Mistake, match="96 examples are seen"):
        ch02.check_number(np.int64(96), "ch02_q_unseen", 4, hints={96: "96 examples are seen"})
    with pytest.raises(Mistake, match="should be a number"):
        ch02.check_number(np.array([4]), "ch02_q_unseen")


def test_observations_cross_the_process_boundary_and_errors_get_their_hint_outside(cells):
    """What the isolated grader does: case and observation as JSON, the verdict outside."""
    _, solutions = cells
    runs = [
        (ch02.CSV_DATASET, solutions["ch02_csv_dataset"], None),
        (ch02.CSV_DATASET, answers.CSV_HEADER_AS_REVIEW, "the header `text,label`"),
        (ch02.WORKER_INIT, solutions["ch02_worker_init"], None),
        (ch02.WORKER_INIT, answers.INIT_NUMPY_SEED_TOO_BIG, "takes seeds below 2**32"),
    ]
    for exercise, source, phrase in runs:
        fn = run_answer(cells, source, exercise.function)
        case = exercise.cases(False)[0]
        observed = codec.loads(codec.dumps(exercise.observe(fn, json.loads(json.dumps(case)))))
        if phrase is None:
            exercise.judge(case, observed)
            continue
        with pytest.raises(Mistake) as caught:
            exercise.judge(case, observed)
        assert phrase in str(caught.value)


def test_hidden_cases_change_with_the_grading_seed(monkeypatch):
    monkeypatch.setenv("FORGE_GRADING_SEED", "1")
    csv_first, init_first = ch02.csv_dataset_cases(True), ch02.worker_init_cases(True)
    monkeypatch.setenv("FORGE_GRADING_SEED", "2")
    assert ch02.csv_dataset_cases(True) != csv_first
    assert ch02.worker_init_cases(True) != init_first
    assert ch02.worker_init_cases(False) == ch02.worker_init_cases(False)


# ---------------------------------------------------------------- where workers are spawned

# A notebook on Windows, as far as Linux can play it: no fork for the checks' workers, spawn as
# the default, and the answers defined in `__main__` by a program that has no file (a kernel's
# cells), so a spawned worker cannot import them by name.
WITHOUT_FORK = """
import json, multiprocessing
multiprocessing.set_start_method("spawn", force=True)
from forge_course.observe import ch02 as observe
observe._CONTEXT = None
from forge_course.grading import Mistake, ch02
cells = json.loads(CELLS)
for source in cells["run"]:
    exec(source, globals())
verdicts = {}
for name, check, answer in [("csv", ch02.check_csv_dataset, ReviewsDataset),
                            ("init", ch02.check_worker_init, worker_init_fn)]:
    try:
        check(answer, thorough=name == "csv")  # every spawned worker imports torch: a few
        verdicts[name] = "passed"
    except Mistake as mistake:
        verdicts[name] = str(mistake)
exec(cells["wrong"], globals())
try:
    ch02.check_worker_init(worker_init_fn)
    verdicts["wrong"] = "passed"
except Mistake as mistake:
    verdicts["wrong"] = str(mistake)
print(json.dumps(verdicts))
"""


@pytest.mark.slow
def test_checks_hand_notebook_answers_to_spawned_workers(cells):
    """Windows has no fork: the worker_init check's workers are spawned and receive the
    notebook's function by value; the dataset's loader case runs without workers."""
    import subprocess

    settings, solutions = cells
    run = [settings, solutions["ch02_csv_dataset"], solutions["ch02_worker_init"]]
    # The known mistake tried first: each one tried costs six more spawned workers.
    payload = json.dumps({"run": run, "wrong": answers.INIT_GLOBAL_SEEDS})
    program = f"CELLS = {payload!r}\n" + WITHOUT_FORK
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdicts["csv"] == "passed" and verdicts["init"] == "passed", verdicts
    assert "never get new seeds" in verdicts["wrong"], verdicts
