"""Answers that chapter 02's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook. The cells
run after the chapter's settings cell, which imports csv, random, numpy, torch, Dataset,
get_worker_info and the data helpers.
"""

CSV_HEADER_AS_REVIEW = """
class ReviewsDataset(Dataset):
    def __init__(self, path, vocabulary):
        with open(path, newline="", encoding="utf-8") as f:
            self.rows = [(encode(text, vocabulary), int(label)) for text, label in csv.reader(f)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        ids, label = self.rows[index]
        return ids, torch.tensor(label)
"""

# Iterating a DataLoader then asks for one index too many, and fails with an IndexError.
CSV_LEN_COUNTS_HEADER = """
class ReviewsDataset(Dataset):
    def __init__(self, path, vocabulary):
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            next(reader)
            self.rows = [(text, int(label)) for text, label in reader]
            self.n_lines = len(self.rows) + 1
        self.vocabulary = vocabulary

    def __len__(self):
        return self.n_lines

    def __getitem__(self, index):
        text, label = self.rows[index]
        return encode(text, self.vocabulary), torch.tensor(label)
"""

CSV_SPLIT_ON_COMMAS = """
class ReviewsDataset(Dataset):
    def __init__(self, path, vocabulary):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()[1:]
        self.texts = [line.split(",")[0] for line in lines]
        self.labels = [int(line.split(",")[-1]) for line in lines]
        self.vocabulary = vocabulary

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, index):
        return encode(self.texts[index], self.vocabulary), torch.tensor(self.labels[index])
"""

CSV_KEEPS_FILE_OPEN = """
class ReviewsDataset(Dataset):
    def __init__(self, path, vocabulary):
        self.file = open(path, newline="", encoding="utf-8")
        self.rows = list(csv.DictReader(self.file))
        self.vocabulary = vocabulary

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        row = self.rows[index]
        return encode(row["text"], self.vocabulary), torch.tensor(int(row["label"]))
"""

# Correct, and written differently: no Dataset base class, reads one row per item straight from
# the file (slow, but right), tokenises by hand, checks its index itself.
CSV_REREADS_EACH_ITEM = """
import itertools


class ReviewsDataset:
    def __init__(self, path, vocabulary):
        self.path, self.vocabulary = path, vocabulary
        with open(path, newline="", encoding="utf-8") as f:
            self.count = sum(1 for _ in csv.DictReader(f))

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(f"review {index} does not exist")
        with open(self.path, newline="", encoding="utf-8") as f:
            row = next(itertools.islice(csv.DictReader(f), index, None))
        ids = [self.vocabulary.get(word, UNK_ID) for word in tokenize(row["text"])]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(int(row["label"]))
"""

INIT_GLOBAL_SEEDS = """
def worker_init_fn(worker_id):
    np.random.seed(42 + worker_id)
    random.seed(42 + worker_id)
"""

INIT_WORKER_ID_ONLY = """
def worker_init_fn(worker_id):
    dataset = get_worker_info().dataset
    dataset.np_rng = np.random.default_rng(worker_id)
    dataset.py_rng = random.Random(worker_id)
"""

INIT_NUMPY_SEED_TOO_BIG = """
def worker_init_fn(worker_id):
    info = get_worker_info()
    np.random.seed(info.seed)
    info.dataset.np_rng = np.random
    info.dataset.py_rng = random.Random(info.seed)
"""

# Correct, and written differently: torch.initial_seed() and a NumPy seed sequence of two words.
INIT_INITIAL_SEED = """
def worker_init_fn(worker_id):
    seed = torch.initial_seed()
    copy = get_worker_info().dataset
    copy.np_rng = np.random.default_rng([worker_id, seed])
    copy.py_rng = random.Random(seed * 1000 + worker_id)
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch02_csv_dataset": [
        (CSV_HEADER_AS_REVIEW, {"ch02_csv_dataset_tests": "the header `text,label`"}),
        (CSV_SPLIT_ON_COMMAS, {"ch02_csv_dataset_tests": "contain a comma are cut at it"}),
        (CSV_KEEPS_FILE_OPEN, {"ch02_csv_dataset_tests": "keeps its file open"}),
        (
            CSV_LEN_COUNTS_HEADER,
            {"ch02_csv_dataset_tests": "len(dataset) should be 164, the number of reviews"},
        ),
    ],
    "ch02_worker_init": [
        (INIT_GLOBAL_SEEDS, {"ch02_worker_init_tests": "never get new seeds"}),
        (INIT_WORKER_ID_ONLY, {"ch02_worker_init_tests": "depend on `worker_id` alone"}),
        (INIT_NUMPY_SEED_TOO_BIG, {"ch02_worker_init_tests": "takes seeds below 2**32"}),
    ],
    "ch02_questions": [
        (
            "unseen_examples = 96\nworker0_batches = 3\nworkers_answer = 'a'\n",
            {
                "ch02_q_unseen": "96 examples are seen",
                "ch02_q_worker_batches": "worker 0 gets the even ones",
                "ch02_q_workers": "workers only load data",
            },
        ),
        (
            "unseen_examples = 6\nworker0_batches = 7\nworkers_answer = 'c'\n",
            {
                "ch02_q_unseen": "6 is the number of batches",
                "ch02_q_worker_batches": "each builds every other batch",
                "ch02_q_workers": "that is pure cost",
            },
        ),
        (
            "unseen_examples = 12\nworker0_batches = 3.5\nworkers_answer = 'd'\n",
            {
                "ch02_q_unseen": "100 − 96",
                "ch02_q_worker_batches": "batches are not split between workers",
                "ch02_q_workers": "that is pin_memory",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch02_csv_dataset": CSV_REREADS_EACH_ITEM,
    "ch02_worker_init": INIT_INITIAL_SEED,
    "ch02_questions": "unseen_examples = 4.0\nworker0_batches = 4\nworkers_answer = ' B '\n",
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch02_csv_dataset": "from forge_course.reference.datasets import ReviewsDataset\n",
    "ch02_worker_init": (
        "from forge_course.reference import datasets\n\n"
        "def worker_init_fn(worker_id):\n    datasets.seed_worker(worker_id)\n"
    ),
}
