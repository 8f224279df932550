"""Mutation testing of every exercise's check: `make mutate`, scores in benchmarks/VALIDITY.md.

A check is only as good as the wrong answers it rejects. This package puts one learner-like
mistake at a time into each solution's answer cell (`mutation.operators`), runs the exercise's
own test cell on each mutant, hidden tests included, in a forked child with a time limit
(`mutation.server`, driven by `mutation.campaign`), and reports the mutants the check lets
through (`mutation.report`). Mutants that no faithful check could tell from the solution are
reviewed by hand into ``mutation/equivalent/chNN.toml``, each with its reason.

Why mutmut's operators: of the maintained Python mutation tools, mutmut (3.x) keeps its
operators as plain functions from a libcst node to its mutated variants
(`mutmut.mutation.mutators.mutation_operators`), so they apply to an answer cell's source
string as they are. Its runner, like cosmic-ray's, works on files of an installed package
under pytest, not on notebook cells run after a settings cell; cosmic-ray's operators work on
parso trees and bring a database, a distributor and a dozen dependencies; mutatest has had no
release since 2022 (PyPI). So the operators come from mutmut and libcst (which mutmut already
depends on), and the running, the learner-specific operators and the report are ours.
"""
