"""Package-level tests, and the course's tools beside them (:mod:`tests.tools`,
:mod:`tests.demo_training`); a package so that ``python -m tests.tools.breakits`` runs from the
root of a clone."""
