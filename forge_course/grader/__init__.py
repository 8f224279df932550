"""The grader: nbgrader's workflow and gradebook, with verdicts reached outside learner code.

Plain ``nbgrader autograde`` runs a submission's code in the same kernel as the tests, so the
submission can rewrite the tests. Here each exercise's answer cell runs alone in a sandboxed
worker (`sandbox`, `worker`) that holds only the learner half of the checks
(`forge_course.observe`): it builds the inputs from cases the grader chose, calls the learner's
function and sends back what it observed as plain JSON data (`codec`). The grader checks every
line it receives and compares the observation with the reference in its own process
(`forge_course.grading.core.Exercise.judge`). Questions send back their answers as plain
values, which the instructor's test code checks here.

Modules: `assignment` (what the instructor's notebook defines), `submission` (one notebook to
per-test results), `run` (a class in parallel, student ids, the signed ledger, gradebook,
feedback and CSV), `tamper` (a static scan that names the obvious), `cgroup` (per-submission
control groups).
"""
