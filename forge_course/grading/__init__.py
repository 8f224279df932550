"""Checks that test cells call: run the learner's code and the reference, compare, explain.

Each chapter has a module (``forge_course.grading.ch04``) with one ``check_<exercise>`` per
exercise; visible tests call it as is, hidden tests with ``thorough=True`` (every device, more
cases, a seed that changes with every grading run).
"""

from forge_course.grading.core import Mistake, check_choice, check_number

__all__ = ["Mistake", "check_choice", "check_number"]
