"""The course's own CI tools, kept out of the shipped package: the break-it runner
(``python -m tests.tools.breakits``), the exercise harness behind ``pytest --mine``
(:mod:`tests.tools.exercises`), the figure check of the lesson texts, the layering check
(``python -m tests.tools.layering``) and the server's load and fault harness
(``python -m tests.tools.load``). Run them from the root of a clone."""
