"""Chapter 02's copy-on-read measurement, against Python's object sizes and real forked workers."""

import mmap
import sys

import numpy as np
import pytest

from forge_course.reference import copy_on_read

PATH = "images/000123.jpg"  # the shape of every path the measurement builds
N_PATHS = 200_000
# Its size and slot: Python 3.12 dropped a pointer from every str (seen on 3.12.3: 58 bytes).
STR_BYTES, SLOT = (66, 80) if sys.version_info < (3, 12) else (58, 64)
BY_HAND_MIB = N_PATHS * SLOT / 2**20  # 15.3 MiB of str objects (12.2 MiB from Python 3.12)

linux_only = pytest.mark.skipif(
    not copy_on_read.measurable(), reason="needs workers started by fork and /proc (Linux)"
)


def test_path_lengths_reads_a_list_and_an_array_alike():
    paths = ["a", "bbb", PATH]
    for held in (paths, np.array(paths, dtype=np.bytes_)):
        dataset = copy_on_read.PathLengths(held)
        assert len(dataset) == 3
        assert [dataset[i] for i in range(3)] == [1, 3, 17]


def test_a_str_takes_its_size_rounded_up_to_16_bytes():
    assert sys.getsizeof(PATH) == STR_BYTES
    assert copy_on_read.str_slot_bytes(PATH) == SLOT
    for n in range(40):
        text = "x" * n
        slot = copy_on_read.str_slot_bytes(text)
        assert slot % 16 == 0 and 0 <= slot - sys.getsizeof(text) < 16


@linux_only
def test_private_memory_counts_pages_written_here():
    # Fresh pages of their own: a long-lived process (a test runner) may hand a new object
    # memory it had written before, which is private already.
    size = 8 * 2**20
    with mmap.mmap(-1, size) as fresh:
        before = copy_on_read.private_mib()
        for offset in range(0, size, 4096):
            fresh[offset] = 1  # one byte per page: every page written
        grown = copy_on_read.private_mib() - before
    assert 7.5 < grown < 10, f"8 MiB written, private memory grew by {grown:.1f} MiB"


@linux_only
@pytest.mark.parametrize("shuffle,share", [(True, 1.0), (False, 0.5)])
def test_forked_workers_copy_the_str_they_read_and_none_of_an_array(shuffle, share):
    # Shuffled, each worker reads about 25 of every page's 51 strings: it copies every page.
    # In order, it reads every other batch of 4,096 consecutive strings: half the pages.
    # Measured in a fresh process, as the chapter does: workers forked from a test runner copy
    # pages of the runner's own objects as well (their garbage collector writes to them).
    measured = copy_on_read.compare_in_fresh_process(N_PATHS, num_workers=2, shuffle=shuffle)
    assert sorted(measured["list of str"]) == [0, 1]
    assert measured["slot"] == SLOT
    expected = share * BY_HAND_MIB
    for worker, grown in measured["list of str"].items():
        assert 0.85 * expected < grown < 1.3 * expected, (worker, grown, expected)
    for worker, grown in measured["one NumPy array"].items():
        assert abs(grown) < 0.2 * BY_HAND_MIB, (worker, grown)
