"""The learner half of every check: turn a plain-data case into inputs, call the answer, report.

This package is all a grading worker imports of the course's checks (``forge-course grade``
runs learner code in a sandbox that holds nothing else of ``forge_course`` worth reaching).
Its rule: **nothing here knows an answer**. A module may build inputs, instruments and
snapshots, and turn what came out into plain data (`forge_course.observe.common`), but it never
imports ``forge_course.reference`` or ``forge_course.grading``, never holds an expected value or
a known mistake, and never implements anything an exercise asks for. The grader half
(``forge_course.grading.chNN``) keeps the cases' seeds, the references, the expected values,
the known mistakes and the hidden tests, and runs only in the grader's own process (or, in a
notebook, in the learner's kernel, where the references are teaching material anyway).
"""
