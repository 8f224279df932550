"""The grader: nbgrader's workflow and gradebook, with verdicts reached outside learner code.

Plain ``nbgrader autograde`` runs a submission's code in the same kernel as the tests, so the
submission can rewrite the tests. Here each exercise's answer cell runs alone in an isolated
worker (`sandbox`), after a static check for shortcuts and tampering (`tamper`). The worker
builds the inputs from cases the grader chose (seeded anew for each run), calls the learner's
function and sends back what it observed as plain JSON data (`codec`); the grader compares that
with the reference in its own process (`forge_course.grading.core.Exercise.judge`). Questions
send back their answers as plain values, which the instructor's test code checks here.

Modules: `assignment` (what the instructor's notebook defines), `submission` (one notebook to
per-test results), `run` (a class in parallel, the ledger, gradebook, feedback and CSV).
"""
